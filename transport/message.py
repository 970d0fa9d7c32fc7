"""The transfer protocol of every message backend (UCX, MPI, local), written once.

```
seq 0     preamble (magic, version, header_len) + the header when it fits (first_message_bytes)
seq 1     the header (Arrow IPC, one row per block), only when it did not fit in seq 0
seq 2+m   data message m: the bytes of a run of consecutive blocks, at most MESSAGE_BYTES
          (transport.layout.message_runs; a bigger block travels alone)
```

The runs are a pure function of the block sizes, which both sides know from the transfer spec,
so the receiver posts every receive at once, before the header arrives; the sender posts the
data first and encodes the header while the bytes move. A transfer of one data message moved
plainly (``_plain_data``) goes in one round instead: header and data posted together, both
receives posted together, the data verified once the header is decoded — for a small transfer
the tasks and loop turns of the overlap cost more than they hide. A KV state of a
thousand 16-token blocks travels as a handful of messages instead of a thousand: per-message
costs (a rendezvous, a Python future, an event-loop hop) are paid per run. A run whose blocks
lie back to back in one allocation (blocks carved from one slab, :mod:`transport.memory`) is
sent from and received into place; otherwise the sender gathers it into a staging span, and
the receiver lands it in a staging span and scatters it into the caller's tensors. Without
caller tensors, each run lands in a fresh slab span and its blocks are views of it. Each run's
blocks are checksum-verified as soon as it lands (once the header is known), while later runs
are still arriving.

Backends implement two primitives: ``_send_msgs`` (post messages, return when all buffers may
be reused) and ``_recv_msgs`` (post receives, report each landed message). A backend that
writes the bytes itself (local) may hash them as it writes and report the digests with the
message, so verification does not read the bytes a second time. Data messages go through
``_send_data``/``_recv_data`` (by default the same primitives), where a backend may move the
bytes another way (MPI: the sender writes them into a same-host receiver, ``transport.cma``)
and both sides must agree on it from the spec.
"""

from __future__ import annotations

import asyncio
import ctypes
import time
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from transport.base import Received, TransferSpec, TransferStats, Transport, check_into
from transport.checksums import verify_buffer, verify_bytes
from transport.errors import WireFormatError
from transport.memory import host_arena
from transport.wire import (
    MAGIC,
    PREAMBLE,
    WIRE_VERSION,
    BlockHeader,
    decode_header,
    dtype_from_name,
    encode_header,
    message_runs,
)

__all__ = ["Landed", "MessageTransport", "first_message_bytes"]


class Landed(Protocol):
    """``landed(i)``: message ``i`` is complete, verify it; ``landed(i, digests)``: complete,
    and ``digests`` are the xxh3-64 of its blocks as they were written to the receive buffer."""

    def __call__(self, index: int, digests: Sequence[int] | None = None, /) -> None: ...


@dataclass(slots=True)
class _Inbound:
    """Where one data message lands and which blocks it carries."""

    blocks: range
    landing: torch.Tensor  # flat uint8 span of the message's bytes (in place, staging or fresh)
    view: memoryview  # the same bytes, for the backend and the checksums
    scatter_to: list[torch.Tensor] | None  # the blocks' own memory when landing is staging


class MessageTransport(Transport):
    """A transport built on ordered, tagged messages; see the module doc.

    The first message carries the preamble and, when it fits in :func:`first_message_bytes`
    (64 KiB plus 512 bytes per block, a bound both sides compute from the spec), the header
    too: one message, whose receive is posted with the data's, so it lands right after the
    first data message instead of queueing behind all of them.
    """

    CONTROL_SEQ = (1 << 20) - 1

    @abstractmethod
    async def _send_msg(self, spec: TransferSpec, seq: int, buf: memoryview) -> None:
        """Send one message; return when ``buf`` may be reused."""

    @abstractmethod
    async def _recv_msg(self, spec: TransferSpec, seq: int, buf: memoryview) -> None:
        """Receive one message of at most ``len(buf)`` bytes into the front of ``buf``."""

    async def _send_msgs(self, spec: TransferSpec, msgs: list[tuple[int, memoryview]]) -> None:
        """Send several messages; backends that can keep them in flight together override this."""
        for seq, buf in msgs:
            await self._send_msg(spec, seq, buf)

    async def _recv_msgs(self, spec: TransferSpec, msgs: list[tuple[int, memoryview]], landed: Landed) -> None:
        """Receive several messages, calling ``landed(i)`` as soon as ``msgs[i]`` is complete."""
        for i, (seq, buf) in enumerate(msgs):
            await self._recv_msg(spec, seq, buf)
            landed(i)

    async def _send_data(self, spec: TransferSpec, msgs: list[tuple[int, memoryview]]) -> None:
        """Send data messages (seq ≥ 2); the default is :meth:`_send_msgs`."""
        await self._send_msgs(spec, msgs)

    async def _recv_data(self, spec: TransferSpec, msgs: list[tuple[int, memoryview]], landed: Landed) -> None:
        """Receive all data messages of a transfer; the default is :meth:`_recv_msgs`."""
        await self._recv_msgs(spec, msgs, landed)

    def _plain_data(self, spec: TransferSpec) -> bool:
        """Whether this transfer's data messages go through ``_send_msgs``/``_recv_msgs`` as
        they are (``_send_data``/``_recv_data`` add nothing); a backend that moves them another
        way for some transfers says ``False`` for those."""
        return True

    def _sent(self, spec: TransferSpec) -> None:  # noqa: B027 - optional hook
        """Called when a send ends, however it ends (drop per-transfer state)."""

    # ---- control messages ------------------------------------------------------------------
    def send_control(self, peer: str, channel: int, data: bytes) -> None:
        """Send a small control message (acks, barriers) on ``channel`` (any int ≥ 0)."""
        self.run(self._send_msg(TransferSpec(channel, peer, (), ()), self.CONTROL_SEQ, memoryview(data)))

    def recv_control(self, peer: str, channel: int, nbytes: int) -> bytes:
        """Receive a control message of at most ``nbytes`` from ``peer`` on ``channel``."""
        buf = bytearray(nbytes)

        async def run() -> None:
            await self._recv_msg(TransferSpec(channel, peer, (), ()), self.CONTROL_SEQ, memoryview(buf))

        self.run(self._deadline(run(), f"control message from {peer[:32]}"))
        return bytes(buf)

    # ---- the protocol --------------------------------------------------------------------
    async def asend(
        self, spec: TransferSpec, headers: Sequence[BlockHeader], tensors: Sequence[torch.Tensor]
    ) -> TransferStats:
        self._check_spec(spec, headers)
        host = [_host_block(t, n) for t, n in zip(tensors, spec.nbytes, strict=True)]
        start = time.perf_counter()
        ptrs = [t.data_ptr() for t in host]
        staging: list[torch.Tensor] = []  # NOTE: gathered runs must outlive the send
        runs = message_runs(spec.nbytes)
        data = [(2 + m, _outbound(run, ptrs, spec.nbytes, host, staging)) for m, run in enumerate(runs)]

        async def one_round() -> None:
            # NOTE: one data message, moved plainly: header and data posted together, in one
            # call (fewer tasks and loop turns, which is most of what a small transfer costs)
            try:
                await self._send_msgs(spec, [*self._header_msgs(spec, headers), *data])
            finally:
                self._sent(spec)

        async def run() -> None:
            # NOTE: the first data message goes out before the header is encoded (the receiver
            # posted its receives from the spec), the rest after the header: a receiver handles
            # arrivals in order, and a header queued behind all the data would hold every
            # checksum back until the end
            sending = [asyncio.ensure_future(self._send_data(spec, data[:1]))]
            await asyncio.sleep(0)
            sending.append(asyncio.ensure_future(self._send_msgs(spec, self._header_msgs(spec, headers))))
            sending.append(asyncio.ensure_future(self._send_data(spec, data[1:])))
            try:
                await asyncio.gather(*sending)
            finally:
                for task in sending:
                    task.cancel()
                self._sent(spec)

        single = len(data) == 1 and self._plain_data(spec)
        await self._deadline(one_round() if single else run(), f"send of {spec.total_bytes} bytes to {spec.peer[:32]}")
        return TransferStats(self.name, spec.total_bytes, len(host), time.perf_counter() - start)

    def _header_msgs(self, spec: TransferSpec, headers: Sequence[BlockHeader]) -> list[tuple[int, memoryview]]:
        """The header's message(s): seq 0 with the preamble, and the header inline when it fits."""
        header = encode_header(headers)
        first = PREAMBLE.pack(MAGIC, WIRE_VERSION, len(header))
        if PREAMBLE.size + len(header) <= first_message_bytes(spec):
            return [(0, memoryview(first + header))]
        return [(0, memoryview(first)), (1, memoryview(header))]

    async def arecv(self, spec: TransferSpec, into: Sequence[torch.Tensor] | None = None) -> Received:
        limits = self.config.limits
        if spec.total_bytes > limits.max_total_bytes or len(spec.nbytes) > limits.max_blocks:
            raise WireFormatError(
                f"spec announces {len(spec.nbytes)} blocks / {spec.total_bytes} bytes, over the limits {limits}"
            )
        if into is not None and [t.nbytes for t in into] != list(spec.nbytes):
            raise ValueError("receive tensors do not match the sizes the transfer spec announces")
        if into is not None and not all(t.is_cpu and t.is_contiguous() for t in into):
            raise ValueError("receive tensors must be contiguous CPU tensors")
        into_ptrs = [t.data_ptr() for t in into] if into is not None else []
        start = time.perf_counter()
        # NOTE: receives are posted before the header arrives (sizes come from the local spec,
        # already checked against the limits), so the header's latency and decoding overlap
        # the data; each run is verified once both it and the header are in.
        inbound = [_landing(run, spec.nbytes, into, into_ptrs) for run in message_runs(spec.nbytes)]
        known: list[BlockHeader] = []
        pending: list[tuple[int, Sequence[int] | None]] = []

        def settle(m: int, digests: Sequence[int] | None) -> None:
            msg, offset = inbound[m], 0
            for j, i in enumerate(msg.blocks):
                if digests is None:
                    verify_buffer(known[i], msg.view[offset : offset + spec.nbytes[i]])
                else:
                    verify_bytes(known[i], digests[j])
                offset += spec.nbytes[i]
            if msg.scatter_to is not None:  # NOTE: only verified bytes reach the caller's tensors
                parts = msg.landing.split([spec.nbytes[i] for i in msg.blocks])
                for dst, src in zip(msg.scatter_to, parts, strict=True):
                    dst.copy_(src)

        def landed(m: int, digests: Sequence[int] | None = None) -> None:
            settle(m, digests) if known else pending.append((m, digests))

        def accept(headers: list[BlockHeader]) -> None:
            """Check the header against the spec and ``into``, then verify what already landed."""
            self._check_received(spec, headers)
            if into is not None:
                check_into(headers, into)
            known.extend(headers)
            for m, digests in pending:
                settle(m, digests)

        def received(headers: list[BlockHeader]) -> Received:
            tensors = _blocks(headers, inbound, spec.nbytes) if into is None else list(into)
            if self.config.device != "cpu":
                tensors = [t.to(self.config.device, non_blocking=True) for t in tensors]
            stats = TransferStats(self.name, spec.total_bytes, len(headers), time.perf_counter() - start)
            return Received(headers, tensors, stats)

        async def run() -> Received:
            msgs = [(2 + m, msg.view) for m, msg in enumerate(inbound)]
            data = asyncio.ensure_future(self._recv_data(spec, msgs, landed))
            try:
                headers = await self._recv_header(spec)
                accept(headers)
                await data
            finally:
                data.cancel()
            return received(headers)

        async def one_round() -> Received:
            # NOTE: one data message, moved plainly: its receive and the header's are posted in
            # one call; the data is verified once the header is decoded (nothing to overlap)
            first = bytearray(first_message_bytes(spec))

            def arrived(i: int, digests: Sequence[int] | None = None) -> None:
                if i == 1:  # NOTE: the data; the header is message 0 of this round
                    pending.append((0, digests))

            await self._recv_msgs(spec, [(0, memoryview(first)), (2, inbound[0].view)], arrived)
            headers = await self._header_in(spec, first)
            accept(headers)
            return received(headers)

        single = len(inbound) == 1 and self._plain_data(spec)
        return await self._deadline(
            one_round() if single else run(), f"receive of {spec.total_bytes} bytes from {spec.peer[:32]}"
        )

    async def _recv_header(self, spec: TransferSpec) -> list[BlockHeader]:
        first = bytearray(first_message_bytes(spec))
        await self._recv_msg(spec, 0, memoryview(first))
        return await self._header_in(spec, first)

    async def _header_in(self, spec: TransferSpec, first: bytearray) -> list[BlockHeader]:
        """The header, from the first message (and message 1 when it did not fit there)."""
        limits = self.config.limits
        magic, version, header_len = PREAMBLE.unpack_from(first)
        if magic != MAGIC or version != WIRE_VERSION:
            raise WireFormatError(f"not a GraphFlow KV transfer (magic {magic!r}, version {version})")
        if header_len > limits.max_header_bytes:
            raise WireFormatError(f"header of {header_len} bytes exceeds the limit {limits.max_header_bytes}")
        if PREAMBLE.size + header_len <= len(first):
            return decode_header(memoryview(first)[PREAMBLE.size : PREAMBLE.size + header_len], limits)
        buf = bytearray(header_len)
        await self._recv_msg(spec, 1, memoryview(buf))
        return decode_header(memoryview(buf), limits)


def first_message_bytes(spec: TransferSpec) -> int:
    """The receive buffer of a transfer's first message (preamble + header when it fits):
    64 KiB plus 512 bytes per block, enough for the header of blocks of up to ~80 tokens."""
    return (64 << 10) + 512 * len(spec.block_keys)


def _host_block(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The block's tensor in host memory, checked to be contiguous and ``nbytes`` long."""
    host = t if t.is_cpu else t.cpu()  # NOTE: is_cpu and nbytes: the cheapest of torch's accessors, per block
    if not host.is_contiguous() or host.nbytes != nbytes:
        raise ValueError(f"block tensors must be contiguous and match the header's sizes ({nbytes} bytes)")
    return host


class _Pinned(np.ndarray):
    """Bytes owned by tensors elsewhere; holds them alive for as long as a view exists."""

    owner: object


def _address_view(ptr: int, nbytes: int, owner: object) -> memoryview:
    """A writable byte view of ``nbytes`` at ``ptr`` that keeps ``owner`` (the tensors holding
    those bytes) alive: a backend keeps the views of abandoned messages until it closes, so a
    late arrival can never land in freed memory."""
    if nbytes == 0:
        return memoryview(bytearray())
    arr = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr)).view(_Pinned)
    arr.owner = owner
    return arr.data


def _back_to_back(run: range, ptrs: Sequence[int], nbytes: Sequence[int]) -> bool:
    """Whether each block of ``run`` starts where the previous one ends."""
    return all(ptrs[i] == ptrs[i - 1] + nbytes[i - 1] for i in run[1:])


def _outbound(
    run: range, ptrs: Sequence[int], nbytes: Sequence[int], host: Sequence[torch.Tensor], keep: list[torch.Tensor]
) -> memoryview:
    """One run's bytes as one buffer: in place when its blocks lie back to back, else
    gathered into a staging span (appended to ``keep``, which the caller holds until sent)."""
    total = sum(nbytes[i] for i in run)
    if _back_to_back(run, ptrs, nbytes):
        return _address_view(ptrs[run.start], total, [host[i] for i in run])
    staging = _gather([host[i] for i in run], total)
    keep.append(staging)
    return _address_view(staging.data_ptr(), total, staging)


def _gather(blocks: list[torch.Tensor], total: int) -> torch.Tensor:
    """Copy scattered blocks into one staging span (the slow path; see the module doc)."""
    staging = host_arena().empty_bytes(total)
    torch.cat([b.reshape(-1).view(torch.uint8) for b in blocks], out=staging)
    return staging


def _landing(
    run: range, nbytes: Sequence[int], into: Sequence[torch.Tensor] | None, into_ptrs: Sequence[int]
) -> _Inbound:
    """Choose where the data message carrying ``run`` lands (``into_ptrs``: the addresses of
    the checked ``into`` tensors)."""
    total = sum(nbytes[i] for i in run)
    if into is not None:
        if _back_to_back(run, into_ptrs, nbytes):
            view = _address_view(into_ptrs[run.start], total, [into[i] for i in run])
            return _Inbound(run, into[run.start], view, None)  # lands in place
        staging = host_arena().empty_bytes(total)
        view = _address_view(staging.data_ptr(), total, staging)
        return _Inbound(run, staging, view, [_bytes_of(into[i]) for i in run])
    span = host_arena().empty_bytes(total)
    return _Inbound(run, span, _address_view(span.data_ptr(), total, span), None)


def _blocks(headers: Sequence[BlockHeader], inbound: Sequence[_Inbound], nbytes: Sequence[int]) -> list[torch.Tensor]:
    """Each block as a view of the span its message landed in, shaped as its header says."""
    out: list[torch.Tensor] = []
    for msg in inbound:
        lo, offset = msg.blocks.start, 0
        while lo < msg.blocks.stop:  # NOTE: blocks alike (the usual case) are cut in one call
            h = headers[lo]
            hi = lo + 1
            while hi < msg.blocks.stop and headers[hi].shape == h.shape and headers[hi].dtype == h.dtype:
                hi += 1
            alike = msg.landing[offset : offset + (hi - lo) * h.nbytes]
            out += alike.view(dtype_from_name(h.dtype)).view(hi - lo, *h.shape).unbind(0)
            lo, offset = hi, offset + (hi - lo) * h.nbytes
    return out


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous CPU tensor (same memory)."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("block tensors must be contiguous CPU tensors")
    return t.reshape(-1).view(torch.uint8)
