from __future__ import annotations

from graphflow.bench.sweep import SweepPlan, _calib_lengths


def test_calibration_grid_is_separate_from_the_sweep_grid():
    big = SweepPlan("m", [256, 1024, 4096, 8192])
    assert _calib_lengths(big) == [96, 384, 1536, 3000, 6000]
    small = SweepPlan("m", [256, 1024])
    cal = _calib_lengths(small)
    assert len(cal) >= 3 and not set(cal) & {256, 1024} and max(cal) <= 1024
