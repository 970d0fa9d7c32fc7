"""Reproducible studies: each folder's run.py writes CSV + meta.json; its plot.py draws the PNG from the CSV."""
