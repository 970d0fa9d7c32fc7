"""Host memory for KV blocks and receive buffers, carved from huge-page slabs.

Same-host transfers (MPI's and UCX's shared-memory paths use cross-memory attach,
``process_vm_readv``) pin the *sender's* pages one at a time. Measured here (``mpirun -n 2``,
16 MiB, Open MPI 5 ``smsc/cma``): 7.5 GB/s out of 4 KiB pages, 17 GB/s out of 2 MiB
transparent huge pages; the receiver's page size mattered little (16.4 GB/s into 4 KiB pages).
numpy advises huge pages for arrays of 4 MiB and more, torch does not, and a KV block of
16 tokens (0.2–0.7 MiB) is too small to get one on its own. So blocks live in slabs:

```
slab: 2 MiB-aligned, madvise(MADV_HUGEPAGE), slab_bytes long
+---------+---------+---------+---------- not yet handed out ----------+
| block a | block b | block c |                                        |
+---------+---------+---------+----------------------------------------+
^ huge page boundary          ^ next carve (64-byte aligned)
```

A tensor handed out is a view of its slab; torch frees the slab when the last view dies, so a
long-lived block keeps its slab's memory (at most ``slab_bytes``) alive. Untouched parts of a
slab cost address space, not resident memory. Requests of more than half a slab get a slab of
their own. Where the kernel offers no huge pages (THP ``never``) the advice is a no-op and the
slabs are ordinary memory.

Each slab is an anonymous mapping of its own, unmapped when its last view dies, never memory
from malloc. A slab taken from malloc's heap (an 8 MiB ``torch.empty`` is heap memory in a
replica, whose malloc maps only buffers of 32 MiB and more on their own) left its huge-page
advice on those heap addresses once it was freed: malloc handed them out again for small
buffers, and the first touch of any of them, after a trim, faulted in a whole 2 MiB page.
Measured (2026-12-07, a scratch driver of the shared-root trial of ``graphflow bench serve``:
16 agents over one 4K SmolLM2 root on an embedded two-replica deployment, five trials each
way, not a committed command): 190 MiB of one replica's heap (26 of the other's) was in huge
pages after the trials (0 with slabs mapped), and the holder's peak growth per trial was
117–136 MiB (median 128) against 104–134 MiB (median 118) with slabs mapped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from transport.layout import MESSAGE_BYTES, message_runs

__all__ = [
    "HUGE_PAGE_BYTES",
    "HostArena",
    "Reservation",
    "advise_huge_pages",
    "give_back",
    "give_back_pages",
    "host_arena",
]

HUGE_PAGE_BYTES = 2 << 20
_ALIGN = 64
_MADV_DONTNEED = 4
_MADV_HUGEPAGE = 14


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None


_LIBC = _libc()


def _advise_huge(ptr: int, nbytes: int) -> bool:
    """Ask the kernel to back ``[ptr, ptr + nbytes)`` with transparent huge pages."""
    if _LIBC is None:
        return False
    return _LIBC.madvise(ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes), _MADV_HUGEPAGE) == 0


def give_back_pages(start: int, end: int) -> None:
    """Hand the whole pages inside the host memory ``[start, end)`` back to the OS now: their
    contents are lost (read again, they are zeros) and they stop counting as resident until
    written again. The pages that ``start`` and ``end`` cut are left alone."""
    page = mmap.PAGESIZE
    lo, hi = _round_up(start, page), end // page * page
    if _LIBC is not None and hi > lo:
        _LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED)


def give_back(tensor: torch.Tensor) -> None:
    """Hand the whole pages inside a CPU tensor back to the OS now (their contents are lost):
    a slab dropped afterwards is freed to malloc, which may keep its pages resident otherwise."""
    give_back_pages(tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size())


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Ask for huge pages under the whole 2 MiB pages inside a CPU tensor not yet touched (one
    the arena did not carve: a buffer malloc mapped on its own). False where nothing was advised."""
    if tensor.device.type != "cpu":
        return False
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    lo = _round_up(start, HUGE_PAGE_BYTES)
    hi = end // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    return hi > lo and _advise_huge(lo, hi - lo)


def _numel(shape: Sequence[int]) -> int:
    numel = 1
    for d in shape:
        if d < 0:
            raise ValueError(f"negative dimension in shape {tuple(shape)}")
        numel *= d
    return numel


def _storage_use_count() -> Callable[[torch.Tensor], int] | None:
    """How many tensors share a tensor's storage (torch's private ``_storage_Use_Count``);
    ``None`` where this torch lacks it, and then slabs are simply not recycled."""
    fn = getattr(torch._C, "_storage_Use_Count", None)
    if fn is None:
        return None
    return lambda t: int(fn(t.untyped_storage()._cdata))


_USE_COUNT = _storage_use_count()


def _use_count(t: torch.Tensor) -> int:
    assert _USE_COUNT is not None
    return _USE_COUNT(t)


def _mapped(nbytes: int) -> torch.Tensor:
    """``nbytes`` of fresh anonymous memory, a mapping of its own (see the module doc), unmapped
    when the last tensor viewing it dies (the tensor holds the ``mmap`` object)."""
    return torch.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), dtype=torch.uint8)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True, slots=True)
class Reservation:
    """What :meth:`HostArena.reserve` faulted in and keeps, and why not more (``""``: all)."""

    nbytes: int
    why_not: str = ""


class HostArena:
    """Carves contiguous CPU tensors out of huge-page slabs (see the module doc).

    Slabs of their own (requests over half a slab: message spans, receive buffers) are kept
    after their last view dies, up to ``keep_bytes`` in all, and handed out again for a request
    of the same size: their pages are already faulted in. Fresh memory is slow to touch (the
    kernel zeroes every page on first use; in this VM a 192 MiB receive into fresh memory took
    ~0.25 s against 25 ms into touched memory), so a replica receiving KV repeatedly recycles
    its buffers the way a serving system's block pool does.

    Args:
        slab_bytes: size of a shared slab; a whole number of huge pages.
        huge_pages: advise huge pages (off: plain slabs, for comparison).
        keep_bytes: most bytes of own-slabs kept for reuse (0: none).
    """

    def __init__(self, slab_bytes: int = 8 << 20, huge_pages: bool = True, keep_bytes: int = 2 << 30) -> None:
        if slab_bytes <= 0 or slab_bytes % HUGE_PAGE_BYTES:
            raise ValueError(f"slab_bytes must be a positive multiple of {HUGE_PAGE_BYTES}, got {slab_bytes}")
        if keep_bytes < 0:
            raise ValueError(f"keep_bytes must be non-negative, got {keep_bytes}")
        self.slab_bytes = slab_bytes
        self.huge_pages = huge_pages
        self.keep_bytes = keep_bytes
        self.slabs_made = 0
        self.slabs_reused = 0
        self.advised = 0
        self._slab: torch.Tensor | None = None
        self._used = 0
        self._kept: dict[int, list[tuple[torch.Tensor, int]]] = {}  # size → (slab, idle use count)
        self._kept_bytes = 0
        self._reserved: set[int] = set()  # data pointers of reserved spans: the pool, never released
        self._lock = threading.Lock()

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous tensor in slab memory."""
        return self._carve(_numel(shape) * dtype.itemsize).view(dtype).view(tuple(shape))

    def empty_bytes(self, nbytes: int) -> torch.Tensor:
        """An uninitialised flat uint8 tensor of ``nbytes`` in slab memory."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be non-negative, got {nbytes}")
        return self._carve(nbytes)

    def empty_run(self, shapes: Sequence[Sequence[int]], dtype: torch.dtype) -> list[torch.Tensor]:
        """Uninitialised contiguous tensors, in order, laid back to back in spans cut as a
        transfer of them cuts its data messages (:func:`transport.layout.message_runs`), so that
        each message is sent from and received into place. Spans stay small (one message), so
        a block that outlives its neighbours keeps at most one message's memory alive."""
        sizes = [_numel(shape) * dtype.itemsize for shape in shapes]
        out: list[torch.Tensor] = []
        for run in message_runs(sizes):
            span = self._carve(sum(sizes[i] for i in run))
            parts = span.split([sizes[i] for i in run])
            out += [p.view(dtype).view(tuple(shapes[i])) for p, i in zip(parts, run, strict=True)]
        return out

    def copy_of(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of a CPU ``tensor`` in slab memory."""
        out = self.empty(tensor.shape, tensor.dtype)
        out.copy_(tensor)
        return out

    @property
    def kept_bytes(self) -> int:
        """Bytes of own-slabs tracked for reuse (in use or idle)."""
        return self._kept_bytes

    def reserve(self, nbytes: int, span_bytes: int = MESSAGE_BYTES) -> Reservation:
        """Fault in ``nbytes`` of own-slabs of ``span_bytes`` now and keep them idle, so later
        receives land in touched memory (a block pool allocated at startup, as vLLM does);
        bounded by ``keep_bytes``. Returns the bytes kept, and why not all of them."""
        size = _round_up(span_bytes, HUGE_PAGE_BYTES)
        if nbytes <= 0:
            return Reservation(0)
        if _USE_COUNT is None:
            return Reservation(0, "this torch build exposes no storage use counts, so idle slabs cannot be kept")
        if size <= self.slab_bytes // 2:
            return Reservation(0, f"spans of {size} bytes are carved from shared slabs, which are not kept idle")
        spans = [self._own(size) for _ in range(-(-nbytes // size))]
        for span in spans:
            span.zero_()
        with self._lock:
            kept_at = {slab.data_ptr() for slab, _ in self._kept.get(size, ())}
            self._reserved |= kept_at & {span.data_ptr() for span in spans}
        kept = size * sum(span.data_ptr() in kept_at for span in spans)
        short = f"bounded by the arena's keep_bytes ({self.keep_bytes} bytes)" if kept < nbytes else ""
        return Reservation(kept, short)

    def release_idle(self) -> int:
        """Stop keeping the own-slabs nobody uses (their memory is freed), but the reserved pool
        (:meth:`reserve`: the replica's standing memory); returns the bytes freed."""
        freed = 0
        with self._lock:
            for size, slabs in self._kept.items():
                busy = [(s, c) for s, c in slabs if _use_count(s) != c or s.data_ptr() in self._reserved]
                freed += size * (len(slabs) - len(busy))
                self._kept[size] = busy
            self._kept_bytes -= freed
        return freed

    @property
    def reserved_bytes(self) -> int:
        """Bytes of the reserved pool (:meth:`reserve`) still kept, idle or in use."""
        with self._lock:
            return sum(
                size * sum(s.data_ptr() in self._reserved for s, _ in slabs) for size, slabs in self._kept.items()
            )

    def shrink_reserved(self, idle_bytes: int) -> int:
        """Free idle spans of the reserved pool until at most ``idle_bytes`` of it sit idle (whole
        spans: it may end up to a span below), handing their pages back to the OS now; the
        arena's ``keep_bytes`` shrinks by as much, so what is freed is not kept again for
        recycling. Spans in use are never touched. Returns the bytes freed."""
        with self._lock:
            idle = [
                (size, slab)
                for size, slabs in self._kept.items()
                for slab, count in slabs
                if slab.data_ptr() in self._reserved and _use_count(slab) == count
            ]
            excess = sum(size for size, _ in idle) - max(idle_bytes, 0)
            drop: list[torch.Tensor] = []
            freed = 0
            for size, slab in idle:
                if freed >= excess:
                    break
                drop.append(slab)
                freed += size
            gone = {slab.data_ptr() for slab in drop}
            for size, slabs in self._kept.items():
                self._kept[size] = [(s, c) for s, c in slabs if s.data_ptr() not in gone]
            self._reserved -= gone
            self._kept_bytes -= freed
            self.keep_bytes = max(0, self.keep_bytes - freed)
        for slab in drop:
            give_back(slab)
        return freed

    def _own(self, size: int) -> torch.Tensor:
        """A slab of its own: an idle kept one of this size, else a new one (kept if room)."""
        with self._lock:
            for slab, idle in self._kept.get(size, ()):
                if _use_count(slab) == idle:
                    self.slabs_reused += 1
                    return slab[:]
            slab = self._new_slab(size)
            if _USE_COUNT is not None and self._kept_bytes + size <= self.keep_bytes:
                self._kept.setdefault(size, []).append((slab, _use_count(slab)))
                self._kept_bytes += size
        return slab[:]

    def _carve(self, nbytes: int) -> torch.Tensor:
        size = _round_up(max(nbytes, 1), _ALIGN)
        if size > self.slab_bytes // 2:
            return self._own(_round_up(size, HUGE_PAGE_BYTES))[:nbytes]
        with self._lock:
            if self._slab is None or self._used + size > self.slab_bytes:
                self._slab, self._used = self._new_slab(self.slab_bytes), 0
            out = self._slab[self._used : self._used + nbytes]
            self._used += size
            return out

    def _new_slab(self, nbytes: int) -> torch.Tensor:
        # NOTE: over-allocating by one huge page costs address space only (never touched)
        raw = _mapped(nbytes + HUGE_PAGE_BYTES)
        offset = -raw.data_ptr() % HUGE_PAGE_BYTES
        slab = raw[offset : offset + nbytes]
        self.slabs_made += 1
        if self.huge_pages and _advise_huge(slab.data_ptr(), nbytes):
            self.advised += 1
        return slab

    def __repr__(self) -> str:
        return f"HostArena(slab_bytes={self.slab_bytes}, huge_pages={self.huge_pages}, slabs_made={self.slabs_made})"


_DEFAULT = HostArena()


def host_arena() -> HostArena:
    """The process-wide arena KV blocks and receive buffers are carved from."""
    return _DEFAULT
