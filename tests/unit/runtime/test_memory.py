from __future__ import annotations

import torch

from graphflow.runtime.memory import release_freed_memory, reset_peak_rss, resident_bytes


def test_peak_growth_is_the_runs_own():
    release_freed_memory()
    assert reset_peak_rss()  # Linux allows resetting VmHWM
    start, peak = resident_bytes()
    assert 0 < start <= peak
    block = torch.ones(64 << 18)  # 64 MiB, every page touched
    _, during = resident_bytes()
    assert during - start >= 60 << 20
    del block
    release_freed_memory()
    reset_peak_rss()
    now, after = resident_bytes()
    assert after - now < 32 << 20  # the reset forgot the 64 MiB peak
