"""Measure a link: timed KV-shaped transfers between two peers over one backend.

Both sides call :func:`probe_pair` (role 0 sends, role 1 receives). Each size is sent
``repeats + 1`` times as blocks of ``block_bytes`` through the real transfer path (header,
checksums), each followed by an acknowledgement; the receiver returns
``(bytes, median seconds)`` per size. The scheduler fits ``latency + bytes / bandwidth`` to
these samples (``scheduler.calibrate.fit_link``) — this module measures, it does not model.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence

import torch

from transport.base import TransferSpec
from transport.checksums import checksum
from transport.message import MessageTransport
from transport.wire import BlockHeader

__all__ = ["probe_blocks", "probe_pair"]

_ACK = 3


def probe_blocks(nbytes: int, block_bytes: int) -> tuple[list[BlockHeader], list[torch.Tensor]]:
    """Synthetic uint8 blocks totalling about ``nbytes`` (at least one block)."""
    if block_bytes <= 0 or nbytes <= 0:
        raise ValueError(f"probe sizes must be positive, got {nbytes}, {block_bytes}")
    tensors = [torch.full((block_bytes,), i % 251, dtype=torch.uint8) for i in range(max(1, nbytes // block_bytes))]
    headers = [
        BlockHeader(i + 1, i, 0, (), "uint8", (block_bytes,), block_bytes, checksum(t)) for i, t in enumerate(tensors)
    ]
    return headers, tensors


def probe_pair(
    t: MessageTransport,
    role: int,
    peer: str,
    sizes: Sequence[int],
    block_bytes: int,
    repeats: int = 3,
    first_transfer_id: int = 1 << 20,
) -> list[tuple[int, float]]:
    """Run one side of the probe; the receiver (role 1) returns its samples, the sender ``[]``.

    Transfer ids are ``first_transfer_id`` onwards, the same sequence on both sides."""
    samples = []
    ids = itertools.count(first_transfer_id)
    for size in sizes:
        headers, tensors = probe_blocks(size, block_bytes)
        times = []
        for r in range(repeats + 1):
            spec = TransferSpec.for_headers(next(ids), peer, headers)
            if role == 0:
                t.send(spec, headers, tensors)
                t.recv_control(peer, _ACK, 1)
            else:
                start = time.perf_counter()
                t.recv(spec)
                if r:  # the first transfer of each size is a warm-up
                    times.append(time.perf_counter() - start)
                t.send_control(peer, _ACK, b"k")
        if role == 1:
            samples.append((sum(h.nbytes for h in headers), statistics.median(times)))
    return samples
