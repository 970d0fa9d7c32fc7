"""Where a trial's CPU time went: the replicas' own processes against the whole host.

On one host, an embedded deployment's replicas share the cores with the client driving them
(executor, one thread per workflow), Ray's own processes (raylet, GCS, workers) and the OS.
:func:`host_busy_seconds` reads the host's busy CPU time from ``/proc/stat`` (every state but
idle and iowait, all cores); the replicas report their own process CPU time
(``ReplicaStats.cpu_s``). Over a trial, replicas' seconds ÷ wall is how many cores the model
work got; the host's less the replicas' is what everything else took.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["host_busy_seconds"]

_IDLE = (3, 4)  # idle, iowait: the 4th and 5th fields of the "cpu" line


def host_busy_seconds() -> float:
    """Busy CPU seconds of this host since boot, every core summed (0.0 without ``/proc/stat``)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/stat") as f:
        fields = f.readline().split()
        if fields and fields[0] == "cpu":
            ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
            busy = sum(t for i, t in enumerate(ticks) if i not in _IDLE)
            return busy / os.sysconf("SC_CLK_TCK")
    return 0.0
