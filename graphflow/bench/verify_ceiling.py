"""``graphflow bench verify-ceiling``: what checksum verification costs one receiving core.

A transfer's receiver must read every byte it verifies; the raw references of the transport
benchmark only copy. This measures, in one process and one run, on block memory laid out as
the transports use it (:mod:`transport.memory` spans), the ratios that bound a transport
whose receiver copies and verifies on the same core:

* ``copy_s`` — ``numpy.copyto`` of the whole span (the ``local`` backend's raw reference);
* ``copy_then_hash_s`` — the copy, then the xxh3-64 of each block of the destination: what a
  receiver pays when the bytes were written by someone else (the kernel's ``process_vm_readv``
  under MPI and UCX) and are read again for the checksum;
* ``copy_and_hash_s`` — :func:`transport.checksums.copy_with_digests`, each chunk hashed right after
  it is copied, still in cache (the ``local`` backend's path);
* ``copy_and_hash_shared_s`` — the same, the span's messages (:func:`transport.layout.message_spans`
  of its blocks) shared between this thread and a helper thread
  (:class:`transport.local.SharedCopy`, the ``local`` backend's path from 4 MiB on);
* ``copy_contended_s`` — the copy while a second thread hashes another span of the same size
  (two cores, so this is what overlapping verification with the copy on the *other* core does
  to the copy: both share the memory bus); ``contending_hash_gbps`` is how fast that helper
  hashed meanwhile.

``ratio_copy_then_hash`` and ``ratio_copy_and_hash`` are ``copy_s`` over those times: the best
``ratio`` a transport can reach when its receiver verifies that way on the copying core, before
any protocol cost; ``ratio_copy_and_hash_shared`` the same on two threads.
``copy_slowdown_contended`` is ``copy_s / copy_contended_s``. All medians of individually
timed runs after one warm-up run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
import xxhash

from graphflow.runtime.calibration import median_seconds
from transport.checksums import copy_with_digests
from transport.layout import message_spans
from transport.local import SharedCopy
from transport.memory import host_arena

__all__ = ["CeilingRow", "verify_ceiling"]


@dataclass(frozen=True, slots=True)
class CeilingRow:
    """One size's medians; the ratios are derived from them (see the module docstring)."""

    nbytes: int
    block_bytes: int
    copy_s: float
    copy_then_hash_s: float
    copy_and_hash_s: float
    copy_and_hash_shared_s: float
    copy_contended_s: float
    contending_hash_gbps: float

    @property
    def copy_gbps(self) -> float:
        return self.nbytes / self.copy_s / 1e9

    @property
    def ratio_copy_then_hash(self) -> float:
        return self.copy_s / self.copy_then_hash_s

    @property
    def ratio_copy_and_hash(self) -> float:
        return self.copy_s / self.copy_and_hash_s

    @property
    def ratio_copy_and_hash_shared(self) -> float:
        return self.copy_s / self.copy_and_hash_shared_s

    @property
    def copy_slowdown_contended(self) -> float:
        return self.copy_s / self.copy_contended_s

    def to_json(self) -> dict[str, float | int]:
        derived = (
            "copy_gbps",
            "ratio_copy_then_hash",
            "ratio_copy_and_hash",
            "ratio_copy_and_hash_shared",
            "copy_slowdown_contended",
        )
        return {**asdict(self), **{k: getattr(self, k) for k in derived}}


def _hash_blocks(buf: np.ndarray, block_bytes: int) -> list[int]:
    return [xxhash.xxh3_64_intdigest(buf[lo : lo + block_bytes].data) for lo in range(0, buf.nbytes, block_bytes)]


def _contended_copy(copy: Callable[[], object], other: np.ndarray, repeats: int) -> tuple[float, float]:
    """Median time of ``copy`` while a helper thread hashes ``other`` over and over (``update``
    releases the GIL, so the two run on both cores), and the helper's hashing rate over the
    same stretch in bytes per second (near zero would mean it never ran alongside)."""
    stop, started = threading.Event(), threading.Event()
    hashed = [0]

    def hash_forever() -> None:
        started.set()
        while not stop.is_set():
            h = xxhash.xxh3_64()
            h.update(other.data)
            hashed[0] += other.nbytes

    helper = threading.Thread(target=hash_forever, name="verify-ceiling-hash", daemon=True)
    helper.start()
    started.wait()
    try:
        begin, before = time.perf_counter(), hashed[0]
        copy_s = median_seconds(copy, repeats)
        rate = (hashed[0] - before) / (time.perf_counter() - begin)
    finally:
        stop.set()
        helper.join()
    return copy_s, rate


def verify_ceiling(
    sizes: list[int], block_bytes: int = 1 << 20, repeats: int = 15, say: Callable[[str], None] = lambda _m: None
) -> list[CeilingRow]:
    """One row per size; see the module doc for the columns."""
    if block_bytes <= 0 or any(s <= 0 for s in sizes):
        raise ValueError("sizes and block bytes must be positive")
    rows = []
    arena = host_arena()
    with ThreadPoolExecutor(1, thread_name_prefix="verify-ceiling-copy") as pool:
        for size in sizes:
            say(f"measuring {size:,} bytes")
            src, dst, other = (arena.empty_bytes(size).numpy() for _ in range(3))
            src[:] = np.resize(np.arange(256, dtype=np.uint8), size)  # NOTE: byte i is i mod 256
            dst[:] = 0
            other[:] = 1
            blocks = [min(block_bytes, size - lo) for lo in range(0, size, block_bytes)]

            def copy_then_hash(s: np.ndarray = src, d: np.ndarray = dst) -> list[int]:
                np.copyto(d, s)
                return _hash_blocks(d, block_bytes)

            def copy_and_hash(s: np.ndarray = src, d: np.ndarray = dst, b: list[int] = blocks) -> list[int]:
                return copy_with_digests(d.data, s.data, b)

            def copy_and_hash_shared(s: np.ndarray = src, d: np.ndarray = dst, b: list[int] = blocks) -> list[int]:
                jobs = [
                    (seq, d[lo : lo + n].data, s[lo : lo + n].data, [b[i] for i in run])
                    for seq, (run, lo, n) in enumerate(message_spans(b))
                ]
                shared = SharedCopy(jobs)
                helper = pool.submit(shared.work)
                shared.work()
                helper.result()
                return [digest for _, digests in shared.result() for digest in digests or ()]

            def copy(s: np.ndarray = src, d: np.ndarray = dst) -> None:
                np.copyto(d, s)

            copy_s = median_seconds(copy, repeats)
            then_s = median_seconds(copy_then_hash, repeats)
            chunked_s = median_seconds(copy_and_hash, repeats)
            shared_s = median_seconds(copy_and_hash_shared, repeats)
            contended_s, hash_rate = _contended_copy(copy, other, repeats)
            if not copy_then_hash() == copy_and_hash() == copy_and_hash_shared():
                raise RuntimeError("the ways of hashing the copied blocks disagree")
            rows.append(
                CeilingRow(size, block_bytes, copy_s, then_s, chunked_s, shared_s, contended_s, hash_rate / 1e9)
            )
    return rows
