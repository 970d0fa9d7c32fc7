"""Reproducible studies: each folder's run.py writes CSV + meta.json, plot.py a PNG."""
