"""Attention parts. Each module here defines a config class and a builder registered with
``@PARTS.register(Config)``; importing this package imports every module in it, so a new variant
is one file in this folder."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
