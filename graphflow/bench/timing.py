"""Timing helper shared by the benchmarks: warm up once, then the median of repeats."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

__all__ = ["median_seconds"]


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Call ``fn`` once untimed, then ``repeats`` times; the median wall-clock seconds."""
    if repeats <= 0:
        raise ValueError(f"repeats must be positive, got {repeats}")
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
