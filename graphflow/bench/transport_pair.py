"""One side of the two-process transport benchmark (run through ``graphflow.harness.pair``).

Role 0 sends, role 1 receives. For each size, both sides run, in turn and ``repeats`` times,
the raw reference (one plain message of ``size`` bytes per iteration over the same backend: an
ucxx ``send`` of a numpy buffer, an MPI ``Send``), ours (a KV transfer of ``size`` bytes cut
into blocks of ``block_bytes``: header, checksums and all, received into pooled tensors) and
*bare*: the raw buffer cut into the data messages the wire would cut (``message_spans``), sent
as plain messages of the backend, the receiver hashing each block of a message (xxh3-64) as
soon as it lands — no header, no checks, no pool. Bare is what a receiver that verifies every
byte reaches over that backend with no protocol around it (for MPI: with Open MPI's own copy,
not the sender-writes path ours takes on one host). Each measurement is ``iters``
back-to-back transfers closed by one acknowledgement, after ``warmup`` untimed ones; role 0
reports seconds per transfer and the medians go into the rows.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash

from graphflow.bench.transport_rows import TransportRow
from transport.base import TransferSpec, Transport
from transport.checksums import checksum
from transport.layout import message_spans
from transport.memory import host_arena
from transport.message import MessageTransport
from transport.pool import TensorPool
from transport.wire import BlockHeader

__all__ = ["BenchPlan", "blocks_for", "run_pair"]

_ACK_SEQ = 1 << 19
_RAW_SEQ = 7
_BARE_SEQ = 16  # NOTE: bare data message m travels as seq 16 + m (below _ACK_SEQ)


@dataclass(frozen=True, slots=True)
class BenchPlan:
    sizes: list[int]
    block_bytes: int = 1 << 20
    iters: int = 5
    warmup: int = 2
    repeats: int = 3

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ValueError("no sizes to measure; pass --sizes, e.g. 1MiB,64MiB")
        if self.iters < 1 or self.repeats < 1:
            raise ValueError(f"--iters and --repeats must be at least 1, got {self.iters} and {self.repeats}")
        if self.warmup < 0:
            raise ValueError(f"warm-up transfers must be non-negative, got {self.warmup}")

    def args(self) -> list[str]:
        """The plan as the two-process entry points take it (``harness.pair``, ``bench.peers``)."""
        return [
            "--sizes",
            ",".join(map(str, self.sizes)),
            "--block-bytes",
            str(self.block_bytes),
            "--iters",
            str(self.iters),
            "--warmup",
            str(self.warmup),
            "--repeats",
            str(self.repeats),
        ]


def blocks_for(size: int, block_bytes: int) -> tuple[list[BlockHeader], list[torch.Tensor]]:
    """Deterministic uint8 blocks totalling ``size`` bytes (the last one may be smaller)."""
    g = torch.Generator().manual_seed(size)
    sizes = [min(block_bytes, size - lo) for lo in range(0, size, block_bytes)]
    # NOTE: laid out as the KV store lays out the blocks of one state (transport.memory)
    tensors = host_arena().empty_run([(n,) for n in sizes], torch.uint8)
    headers = []
    for i, (t, lo) in enumerate(zip(tensors, range(0, size, block_bytes), strict=True)):
        t.copy_(torch.randint(0, 255, (sizes[i],), dtype=torch.uint8, generator=g))
        headers.append(BlockHeader(i + 1, i, lo, (), "uint8", (sizes[i],), sizes[i], checksum(t)))
    return headers, tensors


def _per_transfer_s(role: int, plan: BenchPlan, step: Callable[[], None], sync: Callable[[bool], None]) -> float:
    for _ in range(plan.warmup):
        step()
    sync(role == 0)
    start = time.perf_counter()
    for _ in range(plan.iters):
        step()
    sync(role == 0)
    return (time.perf_counter() - start) / plan.iters


def run_pair(transport: Transport, role: int, peer: str, plan: BenchPlan) -> list[TransportRow]:
    """Run the plan as ``role`` against ``peer``; role 0 returns the rows, role 1 ``[]``."""
    if not isinstance(transport, MessageTransport):
        raise ValueError(f"the two-process benchmark needs a message backend, not {transport.name}")
    t = transport
    ids = itertools.count(1)
    control = TransferSpec(0, peer, (), ())
    ack = bytearray(1)

    def sync(wait: bool) -> None:
        t.run(
            t._recv_msg(control, _ACK_SEQ, memoryview(ack)) if wait else t._send_msg(control, _ACK_SEQ, memoryview(ack))
        )

    pool = TensorPool(max_free_bytes=4 << 30)
    rows = [_measure(t, role, peer, plan, size, ids, sync, pool) for size in plan.sizes]
    return rows if role == 0 else []


def _measure(
    t: MessageTransport,
    role: int,
    peer: str,
    plan: BenchPlan,
    size: int,
    ids: itertools.count[int],
    sync: Callable[[bool], None],
    pool: TensorPool,
) -> TransportRow:
    comm = getattr(t, "comm", None)
    control = TransferSpec(0, peer, (), ())
    raw = np.ones(size, np.uint8) if role == 0 else np.zeros(size, np.uint8)
    headers, tensors = blocks_for(size, plan.block_bytes)
    into = pool.take_for(headers)

    def raw_step() -> None:
        if comm is not None:  # MPI: the plain blocking Send/Recv of one buffer
            comm.Send(raw, dest=1, tag=_RAW_SEQ) if role == 0 else comm.Recv(raw, source=0, tag=_RAW_SEQ)
        else:  # UCX: one plain ucxx send / worker recv of a numpy buffer
            t.run(t._send_msg(control, _RAW_SEQ, raw.data) if role == 0 else t._recv_msg(control, _RAW_SEQ, raw.data))

    bare_msgs, bare_blocks = _bare_cut(raw, [h.nbytes for h in headers])

    def bare_step() -> None:
        def landed(m: int, _digests: Any = None) -> None:
            for block in bare_blocks[m]:
                xxhash.xxh3_64_intdigest(block)

        if role == 0:
            t.run(t._send_msgs(control, bare_msgs))
        else:
            t.run(t._recv_msgs(control, bare_msgs, landed))

    def ours_step() -> None:
        spec = TransferSpec.for_headers(next(ids), peer, headers)
        if role == 0:
            t.send(spec, headers, tensors)
        else:
            t.recv(spec, into=into)

    raw_s, ours_s, bare_s = [], [], []
    for _ in range(plan.repeats):
        raw_s.append(_per_transfer_s(role, plan, raw_step, sync))
        ours_s.append(_per_transfer_s(role, plan, ours_step, sync))
        bare_s.append(_per_transfer_s(role, plan, bare_step, sync))
    if role == 1 and not all(torch.equal(a, b) for a, b in zip(into, tensors, strict=True)):
        raise RuntimeError("benchmark blocks arrived with different bytes")
    if role == 1:
        raw[:] = 0  # NOTE: one more bare transfer into a cleared buffer: bare must deliver every byte
    bare_step()
    if role == 1 and not np.all(raw == 1):
        raise RuntimeError("benchmark bare messages arrived with different bytes")
    ours, raw_median, bare = (statistics.median(s) for s in (ours_s, raw_s, bare_s))
    return TransportRow(t.name, size, len(headers), plan.block_bytes, ours, raw_median, bare)


def _bare_cut(buf: np.ndarray, sizes: list[int]) -> tuple[list[tuple[int, memoryview]], list[list[memoryview]]]:
    """``buf`` cut as the wire cuts a transfer of blocks of ``sizes``: the data messages (seq,
    view) and, per message, its blocks' views."""
    msgs: list[tuple[int, memoryview]] = []
    blocks: list[list[memoryview]] = []
    view = buf.data.cast("B")
    for m, (run, lo, n) in enumerate(message_spans(sizes)):
        msgs.append((_BARE_SEQ + m, view[lo : lo + n]))
        bounds = list(itertools.accumulate((sizes[i] for i in run), initial=lo))
        blocks.append([view[a:b] for a, b in itertools.pairwise(bounds)])
    return msgs, blocks
