"""This process's resident memory, for peak-memory measurements (Linux ``/proc``).

A measurement hands freed memory back to the OS first (:func:`release_freed_memory`), resets the
peak (:func:`reset_peak_rss`), runs, and reads the peak: the growth is then the run's own.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc

from transport.memory import host_arena

__all__ = ["release_freed_memory", "reset_peak_rss", "resident_bytes"]


def resident_bytes() -> tuple[int, int]:
    """(current, peak) resident bytes of this process, from ``/proc/self/status`` (0, 0 elsewhere)."""
    got: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                got[key] = int(value.split()[0]) * 1024
    return got.get("VmRSS", 0), got.get("VmHWM", 0)


def release_freed_memory() -> None:
    """Hand memory freed earlier back to the OS (glibc and the block arena keep it otherwise)."""
    gc.collect()
    host_arena().release_idle()
    with contextlib.suppress(OSError, AttributeError):  # NOTE: not glibc: growth may be understated
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def reset_peak_rss() -> bool:
    """Reset the peak to the current RSS; False where the kernel does not allow it (the peak is
    then the process's lifetime peak, which only overstates)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True
