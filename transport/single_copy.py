"""Same-host single copy: the sender writes a transfer's data straight into the receiver.

Open MPI's and UCX's shared-memory paths have the *receiver* copy each message
(``process_vm_readv``), so the receiving core copies and then verifies, one after the other.
Here the *sender's* core writes (``process_vm_writev``, :mod:`transport.cma`) and the receiver
verifies message m while message m+1 is being written::

    receiver                                     sender
    post the data receives (full size, as ever)
    send the plan  ────────────────────────────▶ (token, pid, cookie, [seq, address, nbytes] …)
                                                 per data message: check the token, write the
                                                 bytes into the receiver, then send the
    message m completes ◀────────────────────── message's first byte alone on its tag
    verify message m   ║   sender writes m+1

The one-byte message lands on the byte the write already put there, so the receiver's side is
the ordinary protocol: a message completes, its blocks are verified. A sender that cannot write
(another host, another pid namespace, no ptrace permission: the receiver's cookie does not read
back) sends the whole message instead, which the full-size receive takes as usual. Both sides
must agree whether a plan travels; backends say so in :meth:`SingleCopyTransport._single_copy_pair`
from what both sides know (MPI: a table both ranks built together when the transport was
created). UCX does not use it: it was measured slower than UCX's own path there (UCX copies
on its progress thread, so its receiver already verifies on another thread while it copies,
and every plan and one-byte message costs UCXX's thread hand-offs; see transport/README.md).

A receive that ends early (deadline, error) clears its token first, so a sender that has not
started a message will not write it; one being written at that moment can still land, so the
buffers of an abandoned receive stay referenced until ``close()`` (the caller's own ``into``
tensors too — reusing them after a failed receive is the caller's risk, as with any transport
that lands bytes asynchronously).
"""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from transport import cma
from transport.base import TransferSpec, TransportConfig
from transport.errors import TransportError
from transport.layout import message_runs
from transport.message import Landed, MessageTransport

__all__ = ["SINGLE_COPY_MIN_BYTES", "Sends", "SingleCopyTransport", "single_copy_allowed"]

SINGLE_COPY_MIN_BYTES = 4 << 20
_PLAN_SEQ = (1 << 20) - 2
_FIXED_WORDS = 6


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where a receiver wants each data message of one transfer written."""

    token_address: int
    token: bytes
    pid: int
    cookie_address: int
    cookie: bytes
    targets: dict[int, tuple[int, int]]  # seq -> (address, nbytes) in the receiver

    @staticmethod
    def words(messages: int) -> int:
        return _FIXED_WORDS + 3 * messages

    @staticmethod
    def encode(cookie: cma.Cookie, token: np.ndarray, msgs: Sequence[tuple[int, memoryview]]) -> np.ndarray:
        head = [token.ctypes.data, int(token[0]), cookie.pid, cookie.address, *np.frombuffer(cookie.value, np.int64)]
        body = [x for seq, buf in msgs for x in (seq, np.frombuffer(buf, np.uint8).ctypes.data, buf.nbytes)]
        return np.array(head + body, np.int64)

    @classmethod
    def decode(cls, words: np.ndarray) -> _Plan:
        rows = words[_FIXED_WORDS:].reshape(-1, 3).tolist()
        return cls(
            int(words[0]),
            words[1:2].tobytes(),
            int(words[2]),
            int(words[3]),
            words[4:6].tobytes(),
            {seq: (addr, n) for seq, addr, n in rows},
        )


class Sends(ABC):
    """Messages of one transfer posted one at a time and awaited together."""

    @abstractmethod
    def post(self, seq: int, buf: memoryview) -> None:
        """Start sending ``buf`` as message ``seq`` now."""

    @abstractmethod
    async def done(self) -> None:
        """Return when every posted buffer may be reused."""


def single_copy_allowed(flag: bool | None) -> bool:
    """A transport's ``single_copy`` argument; ``None`` reads ``GRAPHFLOW_SINGLE_COPY`` (``0``
    turns it off), default on."""
    if flag is None:
        return os.environ.get("GRAPHFLOW_SINGLE_COPY", "1") != "0"
    return flag


class SingleCopyTransport(MessageTransport):
    """A message transport whose same-host data may be written by the sender (module doc)."""

    def __init__(self, config: TransportConfig | None = None) -> None:
        super().__init__(config)
        self._cookie = cma.Cookie()
        self._plans: dict[tuple[str, int], asyncio.Task[_Plan]] = {}
        self._reachable: dict[tuple[int, int, bytes], bool] = {}
        self._orphans: list[Any] = []
        self.single_copy_writes = 0  # NOTE: data messages this endpoint wrote into a receiver

    @abstractmethod
    def _single_copy_pair(self, spec: TransferSpec) -> bool:
        """Whether the receiver of ``spec`` sends a plan and its sender waits for one; both
        sides must answer alike (from what both know), or a sender waits for nothing."""

    def _single_copy_for(self, spec: TransferSpec) -> bool:
        return spec.total_bytes >= SINGLE_COPY_MIN_BYTES and self._single_copy_pair(spec)

    def _plain_data(self, spec: TransferSpec) -> bool:
        return not self._single_copy_for(spec)

    async def _recv_data(self, spec: TransferSpec, msgs: list[tuple[int, memoryview]], landed: Landed) -> None:
        if not self._single_copy_for(spec):
            return await self._recv_msgs(spec, msgs, landed)
        token = np.array([spec.transfer_id + 1], np.int64)
        plan = _Plan.encode(self._cookie, token, msgs)
        sending = asyncio.ensure_future(self._send_msgs(spec, [(_PLAN_SEQ, plan.view(np.uint8).data)]))
        finished = False
        try:
            await self._recv_msgs(spec, msgs, landed)
            await sending
            finished = True
        finally:
            token[0] = 0  # NOTE: from here on a sender refuses to begin a message
            if not finished:
                self._orphans.append((token, plan, sending, [buf for _, buf in msgs]))

    async def _send_data(self, spec: TransferSpec, msgs: list[tuple[int, memoryview]]) -> None:
        if not self._single_copy_for(spec) or not msgs:
            return await self._send_msgs(spec, msgs)
        plan = await asyncio.shield(self._plan(spec))
        sends = self._sends(spec)
        for seq, buf in msgs:
            wrote = self._write(spec, plan, seq, buf)
            sends.post(seq, buf[:1] if wrote else buf)
            await asyncio.sleep(0)
        await sends.done()

    @abstractmethod
    def _sends(self, spec: TransferSpec) -> Sends:
        """Messages of one transfer posted one by one as they are ready, awaited together."""

    def _write(self, spec: TransferSpec, plan: _Plan, seq: int, buf: memoryview) -> bool:
        """Write one message into the receiver; ``False`` when this pair cannot (send it instead).

        Raises:
            TransportError: the receiver no longer waits for this transfer, or planned no room.
        """
        address, room = plan.targets.get(seq, (0, -1))
        if room < buf.nbytes:
            raise TransportError(f"{self.name}: the receiver planned no room for message {seq} of {buf.nbytes} bytes")
        key = (plan.pid, plan.cookie_address, plan.cookie)
        if key not in self._reachable:
            self._reachable[key] = cma.Cookie.reachable(*key)
        if not self._reachable[key] or buf.nbytes == 0:
            return False
        try:
            if cma.read(plan.pid, plan.token_address, len(plan.token)) != plan.token:
                raise TransportError(f"{self.name}: the receiver no longer waits for transfer {spec.transfer_id}")
            cma.write(plan.pid, address, np.frombuffer(buf, np.uint8).ctypes.data, buf.nbytes)
        except cma.CrossMemoryError:
            self._reachable[key] = False  # NOTE: e.g. permission withdrawn; the bytes go by message
            return False
        self.single_copy_writes += 1
        return True

    def _plan(self, spec: TransferSpec) -> asyncio.Task[_Plan]:
        """The receiver's plan for this transfer, received once however many sends need it;
        the receive is posted at once, so the plan lands while the header is encoded."""
        key = (spec.peer, spec.transfer_id)
        task = self._plans.get(key)
        if task is None:
            words = np.empty(_Plan.words(len(message_runs(spec.nbytes))), np.int64)

            async def fetch() -> _Plan:
                await self._recv_msgs(spec, [(_PLAN_SEQ, words.view(np.uint8).data)], lambda _i, _d=None: None)
                return _Plan.decode(words)

            task = self._plans[key] = asyncio.ensure_future(fetch())
        return task

    def _sent(self, spec: TransferSpec) -> None:
        task = self._plans.pop((spec.peer, spec.transfer_id), None)
        if task is not None:
            task.cancel()

    async def _aclose(self) -> None:
        self._orphans.clear()
