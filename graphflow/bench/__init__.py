"""Benchmarks run by ``graphflow bench``: measured on this machine, medians after warm-up."""
