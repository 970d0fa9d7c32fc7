"""One thread of a process computes in parallel; every other thread stays serial.

Why: torch's CPU wheels run their parallel kernels on libgomp (OpenMP) and MKL. libgomp gives
each host thread that starts a parallel region a team of worker threads of its own, and once
the process holds more such threads than it has cores it shortens how long idle workers spin
before sleeping (from 300,000 spins to 100). Every parallel region then wakes its workers
through the kernel. Measured on this 2-core machine (SmolLM2, a 64-token prefill over 1,088
cached tokens, 2 threads): 0.16 s while one host thread ran torch, 0.26 s as soon as a second
one had run one parallel region, on either thread and for good. A replica has several
threads that touch torch (the actor's call threads copying KV, the transport's, the engine
loop), so it keeps the engine loop as the only parallel one (:func:`set_thread_parallelism`)
and runs every other thread with one (``torch.set_num_threads(1)`` for the process first).

Both settings are per thread: OpenMP's ``omp_set_num_threads`` and MKL's
``MKL_Set_Num_Threads_Local``, called on the libraries torch loaded. A torch built without
them (another OpenMP runtime, no MKL) cannot be set per thread; :func:`per_thread_support`
says why, and callers keep the process-wide setting instead.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

__all__ = ["per_thread_support", "set_thread_parallelism"]


@functools.cache
def _libraries() -> tuple[ctypes.CDLL, ctypes.CDLL] | str:
    """(libgomp, the library exporting MKL's per-thread setting) as torch loaded them, or why not."""
    torch.get_num_threads()  # NOTE: makes sure torch's parallel runtime is loaded
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if line.rstrip().endswith(".so") or ".so." in line}
    gomp = sorted(p for p in paths if os.path.basename(p).startswith("libgomp"))
    if not gomp:
        return "torch here does not run on libgomp"
    omp = ctypes.CDLL(gomp[0])
    for p in sorted(p for p in paths if os.path.basename(p).startswith(("libtorch_cpu", "libmkl"))):
        lib = ctypes.CDLL(p)
        if hasattr(lib, "MKL_Set_Num_Threads_Local"):
            return omp, lib
    return "torch here does not expose MKL's per-thread setting (MKL_Set_Num_Threads_Local)"


def per_thread_support() -> str:
    """ "" when threads can be set one by one here, else why not."""
    found = _libraries()
    return found if isinstance(found, str) else ""


def set_thread_parallelism(threads: int) -> None:
    """Run the calling thread's torch kernels on ``threads`` threads, leaving every other
    thread as it is. Raises ``RuntimeError`` where this torch cannot (see the module doc)."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    found = _libraries()
    if isinstance(found, str):
        raise RuntimeError(f"cannot set torch threads per thread: {found}")
    omp, mkl = found
    torch.get_num_threads()  # NOTE: torch sets each new thread's count on first use; after that, ours holds
    omp.omp_set_num_threads(threads)
    mkl.MKL_Set_Num_Threads_Local(threads)
