"""Task glue between data, models, training and evaluation: translation and tagging."""
