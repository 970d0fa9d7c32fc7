from __future__ import annotations

import time

from graphflow.bench.host_cpu import host_busy_seconds


def test_the_host_busy_time_grows_while_this_process_computes():
    before = host_busy_seconds()
    end = time.process_time() + 0.2
    while time.process_time() < end:  # 0.2 s of this process's CPU
        pass
    after = host_busy_seconds()
    assert before > 0
    assert after - before >= 0.15  # this process's 0.2 s at least (tick granularity aside)
