"""One parallel thread per process: the others run torch serially and start no OpenMP team."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from graphflow.models.threads import per_thread_support, set_thread_parallelism

# NOTE: a fresh process: the check counts the process's threads, and torch's settings are global
CHECK = textwrap.dedent(
    """
    import os, threading, torch
    from graphflow.models.threads import set_thread_parallelism

    def tasks():
        return len(os.listdir("/proc/self/task"))

    torch.set_num_threads(1)
    ready, done, seen = threading.Event(), threading.Event(), {}

    def engine():
        set_thread_parallelism(2)
        a = torch.randn(400, 400)
        torch.cat([a @ a] * 64)  # a parallel matmul and copy: this thread's team starts
        seen["engine"] = torch.get_num_threads()
        ready.set()
        done.wait()

    t = threading.Thread(target=engine)
    t.start()
    ready.wait()
    before = tasks()
    torch.cat([torch.randn(30, 3, 1024, 64)] * 4, dim=2).clone()  # large copies on another thread
    print(seen["engine"], torch.get_num_threads(), before, tasks())
    done.set()
    t.join()
    """
)


@pytest.mark.skipif(bool(per_thread_support()), reason=per_thread_support() or "supported")
def test_only_the_parallel_thread_starts_a_team_and_the_others_copy_serially():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, check=True)
    engine, other, before, after = map(int, out.stdout.split())
    assert (engine, other) == (2, 1)
    assert after == before  # no second OpenMP team: libgomp keeps its workers spinning


def test_a_thread_needs_at_least_one_torch_thread():
    with pytest.raises(ValueError, match="at least 1"):
        set_thread_parallelism(0)
