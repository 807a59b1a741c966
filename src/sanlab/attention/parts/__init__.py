"""Attention parts, one variant per pair of modules: ``<name>_config.py`` holds its pydantic config (torch-free,
so the schema loads without torch) and ``<name>.py`` the part and its builder. ``attention/registry.py`` lists
them; nothing here is imported until a config names it."""
