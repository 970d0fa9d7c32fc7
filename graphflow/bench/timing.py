"""Timing helper shared by the benchmarks (one implementation: ``runtime.calibration``)."""

from __future__ import annotations

from graphflow.runtime.calibration import median_seconds

__all__ = ["median_seconds"]
