from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest
import torch

from transport.layout import MESSAGE_BYTES, message_runs, message_spans
from transport.memory import HUGE_PAGE_BYTES, HostArena, Reservation, advise_huge_pages


def test_slabs_are_huge_page_aligned_and_carved_back_to_back():
    arena = HostArena(slab_bytes=2 * HUGE_PAGE_BYTES)
    a = arena.empty((1000,), torch.uint8)
    b = arena.empty((10,), torch.float32)
    assert a.data_ptr() % HUGE_PAGE_BYTES == 0
    assert b.data_ptr() == a.data_ptr() + 1024  # 1000 bytes rounded up to 64-byte alignment
    assert arena.slabs_made == 1


def test_a_full_slab_starts_a_new_one_and_big_requests_get_their_own():
    arena = HostArena(slab_bytes=HUGE_PAGE_BYTES)
    arena.empty_bytes(HUGE_PAGE_BYTES // 2)
    arena.empty_bytes(HUGE_PAGE_BYTES // 2)
    assert arena.slabs_made == 1
    arena.empty_bytes(64)
    assert arena.slabs_made == 2
    big = arena.empty_bytes(3 * HUGE_PAGE_BYTES + 5)
    assert big.numel() == 3 * HUGE_PAGE_BYTES + 5 and big.data_ptr() % HUGE_PAGE_BYTES == 0
    assert arena.slabs_made == 3


def test_copy_of_is_a_contiguous_copy():
    src = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).transpose(0, 2)
    out = HostArena().copy_of(src)
    assert out.is_contiguous() and torch.equal(out, src)
    out.zero_()
    assert src.abs().sum() > 0


def test_empty_run_lays_blocks_out_as_the_wire_cuts_messages():
    big = MESSAGE_BYTES // 2 + 4096  # float32 blocks over half a message: one per message
    shapes = [(big // 4,)] * 3
    blocks = HostArena().empty_run(shapes, torch.float32)
    assert [tuple(b.shape) for b in blocks] == shapes
    assert [len(r) for r in message_runs([big] * 3)] == [1] * 3
    per_message = MESSAGE_BYTES >> 20
    small = HostArena().empty_run([(1 << 18,)] * (per_message + 2), torch.float32)  # 1 MiB blocks
    ptrs = [t.data_ptr() for t in small]
    assert ptrs[:per_message] == [ptrs[0] + k * (1 << 20) for k in range(per_message)]
    assert ptrs[per_message + 1] == ptrs[per_message] + (1 << 20)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="multiple"):
        HostArena(slab_bytes=HUGE_PAGE_BYTES + 1)
    with pytest.raises(ValueError, match="negative"):
        HostArena().empty((2, -1), torch.float32)
    with pytest.raises(ValueError, match="non-negative"):
        HostArena().empty_bytes(-1)


def test_message_runs_are_greedy_and_keep_big_blocks_alone():
    assert message_runs([]) == []
    assert message_runs([1, 1, 1], max_message_bytes=2) == [range(0, 2), range(2, 3)]
    assert message_runs([5, 1, 1], max_message_bytes=2) == [range(0, 1), range(1, 3)]
    assert message_runs([MESSAGE_BYTES] * 2) == [range(0, 1), range(1, 2)]
    with pytest.raises(ValueError):
        message_runs([1], max_message_bytes=0)


def test_message_spans_give_each_runs_bytes():
    assert message_spans([]) == []
    assert message_spans([1, 1, 1], max_message_bytes=2) == [(range(0, 2), 0, 2), (range(2, 3), 2, 1)]
    assert message_spans([5, 1, 1], max_message_bytes=2) == [(range(0, 1), 0, 5), (range(1, 3), 5, 2)]


def test_own_slabs_are_recycled_once_idle_and_released_on_request():
    arena = HostArena()
    first = arena.empty_bytes(6 << 20)  # over half a slab: a slab of its own
    ptr = first.data_ptr()
    view = first[10:20]
    del first
    assert arena.empty_bytes(6 << 20).data_ptr() != ptr  # a view still holds it
    del view
    again = arena.empty_bytes(6 << 20)
    assert again.data_ptr() == ptr and arena.slabs_reused == 1
    del again
    assert arena.release_idle() >= 6 << 20
    assert arena.kept_bytes == 0


def test_keep_bytes_bounds_what_is_kept():
    arena = HostArena(keep_bytes=0)
    a = arena.empty_bytes(6 << 20)
    ptr = a.data_ptr()
    del a
    b = arena.empty_bytes(6 << 20)
    assert arena.slabs_reused == 0 and arena.kept_bytes == 0
    del b, ptr


def _resident_fraction(t: torch.Tensor) -> float:
    """The fraction of ``t``'s pages resident now (``mincore``), without touching them."""
    page = os.sysconf("SC_PAGE_SIZE")
    start = t.data_ptr() // page * page
    length = t.data_ptr() + t.numel() * t.element_size() - start
    pages = (ctypes.c_ubyte * (-(-length // page)))()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), pages) == 0, ctypes.get_errno()
    return sum(p & 1 for p in pages) / len(pages)


def test_reserve_faults_in_spans_that_later_requests_reuse():
    arena = HostArena()
    assert arena.reserve(6 * MESSAGE_BYTES) == Reservation(6 * MESSAGE_BYTES)
    made = arena.slabs_made
    spans = [arena.empty_bytes(MESSAGE_BYTES) for _ in range(6)]
    assert arena.slabs_made == made and arena.slabs_reused == 6
    # NOTE: per page, not the process's RSS: freed heap memory other tests left resident may hold a span
    assert all(_resident_fraction(s) == 1.0 for s in spans)  # resident before their first use
    assert all(not s.any() for s in spans)


def test_the_reserved_pool_survives_releasing_idle_memory():
    arena = HostArena()
    assert arena.reserve(2 * MESSAGE_BYTES) == Reservation(2 * MESSAGE_BYTES)
    extra = arena.empty_bytes(6 << 20)  # a slab of its own beside the pool, idle once dropped
    del extra
    assert arena.release_idle() >= 6 << 20  # the extra slab goes
    assert arena.kept_bytes == 2 * MESSAGE_BYTES and arena.release_idle() == 0  # the pool stays
    made = arena.slabs_made
    spans = [arena.empty_bytes(MESSAGE_BYTES) for _ in range(2)]
    assert arena.slabs_made == made and len(spans) == 2  # and still serves receives


def test_reserve_says_why_it_kept_less_than_asked():
    arena = HostArena(keep_bytes=2 * MESSAGE_BYTES)
    got = arena.reserve(4 * MESSAGE_BYTES)
    assert got.nbytes == 2 * MESSAGE_BYTES and "keep_bytes" in got.why_not
    again = arena.reserve(2 * MESSAGE_BYTES)  # the kept spans are idle again: reused, still kept
    assert again == Reservation(2 * MESSAGE_BYTES)
    small = arena.reserve(MESSAGE_BYTES, span_bytes=1 << 20)
    assert small.nbytes == 0 and "shared slabs" in small.why_not
    assert arena.reserve(0) == Reservation(0)


def test_huge_pages_are_advised_only_over_whole_huge_pages_inside_a_tensor():
    assert not advise_huge_pages(torch.empty(HUGE_PAGE_BYTES // 2, dtype=torch.uint8))  # holds no whole page
    arena = HostArena(slab_bytes=2 * HUGE_PAGE_BYTES)
    arena.empty((10,), torch.uint8)  # the arena's own advice tells whether this kernel takes it
    assert advise_huge_pages(torch.empty(3 * HUGE_PAGE_BYTES, dtype=torch.uint8)) == (arena.advised == 1)


def test_shrinking_the_reserved_pool_frees_only_its_idle_spans():
    arena = HostArena(keep_bytes=0)
    arena.keep_bytes = 6 * MESSAGE_BYTES
    assert arena.reserve(4 * MESSAGE_BYTES) == Reservation(4 * MESSAGE_BYTES)
    extra = arena.empty_bytes(6 << 20)  # a recycled slab beside the pool, not part of it
    del extra
    busy = arena.empty_bytes(MESSAGE_BYTES)  # a receive landed in one pool span
    assert arena.shrink_reserved(MESSAGE_BYTES + 1) == 2 * MESSAGE_BYTES  # 3 idle, at most 1 may stay
    assert arena.reserved_bytes == 2 * MESSAGE_BYTES and arena.keep_bytes == 4 * MESSAGE_BYTES
    assert arena.shrink_reserved(0) == MESSAGE_BYTES  # the busy span stays
    assert arena.reserved_bytes == MESSAGE_BYTES and busy.numel() == MESSAGE_BYTES
    assert arena.release_idle() == 6 << 20  # the recycled slab was never the pool's
    del busy
    assert arena.shrink_reserved(-1) == MESSAGE_BYTES and arena.reserved_bytes == 0
    assert arena.shrink_reserved(0) == 0


_SLAB_MAPPING = """
import gc
import torch
from transport.memory import HostArena

def mappings():
    out = []
    for line in open("/proc/self/maps"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        out.append((lo, hi, line.rstrip().endswith("[heap]")))
    return out

arena = HostArena(keep_bytes=0)
slab = arena.empty_bytes(6 << 20)  # over half a slab: a slab of its own, not kept once idle
ptr = slab.data_ptr()
print("heap" if any(lo <= ptr < hi and heap for lo, hi, heap in mappings()) else "own")
del slab
gc.collect()
print("mapped" if any(lo <= ptr < hi for lo, hi, _ in mappings()) else "unmapped")
"""


def test_slabs_are_mappings_of_their_own_never_mallocs_heap():
    # NOTE: malloc as a replica sets it (graphflow.runtime.actors.REPLICA_ENV) takes buffers under
    # 32 MiB from its heap, where a slab's huge-page advice would outlive the slab (see the module
    # doc); run apart so the setting applies
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
    got = subprocess.run([sys.executable, "-c", _SLAB_MAPPING], env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["own", "unmapped"]
