"""MPI transport (mpi4py point-to-point on raw buffers, never pickled objects).

For processes of one MPI world started by ``mpirun``/``srun``. A peer is named by its rank in
the communicator. Each transport owns a duplicate of the communicator, so its messages never
match anyone else's. Messages of one transfer use tags ``(transfer_id mod 2047) · 2^20 + seq``.

Between ranks on different hosts, all data messages of a transfer are posted at once
(``Isend``/``Irecv`` on contiguous buffers) and each is verified as it completes. (One
``hindexed`` message over scattered blocks was measured slower here: Open MPI packs
non-contiguous datatypes through its two-copy path.)

Between ranks on one host, Open MPI's shared-memory path has the *receiving* rank copy each
message (``process_vm_readv``) inside its progress call, so the receiver's core copies and
then verifies, one after the other. Here the *sender* writes instead (:mod:`transport.cma`),
and MPI carries only the plan and the notices::

    receiver                                   sender
    post notice receives, Isend plan ───────▶  (token address, [seq, address, nbytes] …)
                                               per data message: check the token,
                                               process_vm_writev into the receiver,
    notice m lands ◀────────────────────────   Isend notice m (1 byte: written / failed)
    verify message m   ║  sender writes m+1

so the receiver verifies message m while the sender's core writes m+1 (messages of
``SINGLE_COPY_MESSAGE_BYTES``). The pairs that can do this are found once, when the transport
is created (collectively): each rank reads a random cookie out of every other rank
(:class:`transport.cma.Cookie`), and a pair uses it only when both directions work. A receive
that ends early (deadline, error) clears its token, so a sender that has not started a message
yet will not write it; buffers of an abandoned receive stay referenced until ``close()``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from transport import cma
from transport.base import TransferSpec, TransportConfig
from transport.errors import PeerUnreachable, TransportError
from transport.layout import split_runs
from transport.message import Landed, MessageTransport

__all__ = ["SINGLE_COPY_MESSAGE_BYTES", "MpiTransport"]

_SEQ_BITS = 20
_SPIN_S = 2.0
_PLAN_SEQ = (1 << _SEQ_BITS) - 2
_WRITTEN, _FAILED = 1, 2
SINGLE_COPY_MESSAGE_BYTES = 2 << 20
SINGLE_COPY_MIN_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where a same-host receiver wants each data message written (see the module doc)."""

    token_address: int
    token: int
    targets: dict[int, tuple[int, int]]  # seq -> (address, nbytes) in the receiver

    @staticmethod
    def words(messages: int) -> int:
        return 2 + 3 * messages

    @classmethod
    def decode(cls, words: np.ndarray) -> _Plan:
        rows = words[2:].reshape(-1, 3).tolist()
        return cls(int(words[0]), int(words[1]), {seq: (addr, n) for seq, addr, n in rows})


class MpiTransport(MessageTransport):
    """Args: ``comm``: communicator to duplicate (default ``MPI.COMM_WORLD``); creating the
    transport is collective over it. ``single_copy``: let same-host senders write into the
    receiver (module doc); ``None`` reads ``GRAPHFLOW_MPI_SINGLE_COPY`` (``0`` turns it off),
    default on. A pair uses it only if both ranks allow it."""

    name = "mpi"

    def __init__(self, config: TransportConfig | None = None, comm: Any = None,
                 single_copy: bool | None = None) -> None:  # fmt: skip
        super().__init__(config)
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        self._rank = self._comm.Get_rank()
        self._size = self._comm.Get_size()
        # NOTE: any thread may drive MPI only at MPI_THREAD_MULTIPLE (mpi4py asks for it)
        self.runs_on_caller = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        if single_copy is None:
            single_copy = os.environ.get("GRAPHFLOW_MPI_SINGLE_COPY", "1") != "0"
        self._cookie = cma.Cookie()
        self._pids, self._single_copy = self._single_copy_peers(single_copy)
        self._plans: dict[tuple[int, int], asyncio.Task[_Plan]] = {}
        self._orphans: list[Any] = []
        self.single_copy_receives = 0  # NOTE: transfers this rank received written by their sender

    def _single_copy_peers(self, allowed: bool) -> tuple[list[int], frozenset[int]]:
        """Every rank's pid, and the ranks this one can write to and be written by (collective)."""
        mine = np.frombuffer(np.int64(self._cookie.pid).tobytes() + np.int64(self._cookie.address).tobytes()
                             + self._cookie.value, np.int64)  # fmt: skip
        everyone = np.empty((self._size, mine.size), np.int64)
        self._comm.Allgather(mine, everyone)
        reach = np.zeros(self._size, np.uint8)
        for p in range(self._size):
            pid, address, value = int(everyone[p, 0]), int(everyone[p, 1]), everyone[p, 2:].tobytes()
            reach[p] = allowed and p != self._rank and cma.Cookie.reachable(pid, address, value)
        both = np.empty((self._size, self._size), np.uint8)
        self._comm.Allgather(reach, both)
        pairs = frozenset(p for p in range(self._size) if both[self._rank, p] and both[p, self._rank])
        return everyone[:, 0].tolist(), pairs

    @property
    def single_copy_peers(self) -> frozenset[int]:
        """The ranks whose data this rank writes (and receives) by cross-memory attach."""
        return self._single_copy

    @property
    def address(self) -> str:
        return str(self._rank)

    @property
    def world_size(self) -> int:
        return self._size

    @property
    def comm(self) -> Any:
        """This transport's private communicator (a duplicate of the one it was given)."""
        return self._comm

    def _peer(self, spec: TransferSpec) -> int:
        try:
            rank = int(spec.peer)
        except ValueError:
            raise PeerUnreachable(f"mpi: peer must be a rank number, got {spec.peer!r}") from None
        if not 0 <= rank < self._size or rank == self._rank:
            raise PeerUnreachable(f"mpi: rank {rank} is not another rank of this world (size {self._size})")
        return rank

    def _tag(self, spec: TransferSpec, seq: int) -> int:
        if seq >= 1 << _SEQ_BITS:
            raise ValueError(f"mpi: at most {(1 << _SEQ_BITS) - 2} data messages per transfer")
        return ((spec.transfer_id % 2047) << _SEQ_BITS) | seq

    async def _wait(self, requests: list[Any], landed: Callable[[int], None] | None = None) -> None:
        """Drive MPI progress until all requests complete, calling ``landed(i)`` as request
        ``i`` completes and yielding to the event loop between tests. NOTE: requests are posted
        and tested on this one loop thread: completing them from another thread (``Waitall`` /
        ``Waitsome`` in a helper thread) was measured 2-4x slower here, and sleeping between
        tests starves the receiver's shared-memory copy, which MPI performs inside ``Test``.
        So it spins (yielding) for ``_SPIN_S``, then backs off to 1 ms."""
        MPI = self._mpi
        started = time.monotonic()
        left = len(requests)
        try:
            while left:
                done = MPI.Request.Testsome(requests)
                if done:
                    left -= len(done)
                    if landed is not None:
                        for i in done:
                            landed(i)
                    continue
                spinning = time.monotonic() - started < _SPIN_S
                await asyncio.sleep(0 if spinning else 1e-3)
        except asyncio.CancelledError:
            for r in requests:
                if r != MPI.REQUEST_NULL:
                    r.Cancel()
            raise
        except MPI.Exception as exc:
            raise TransportError(f"mpi: {exc}") from None

    async def _send_msg(self, spec: TransferSpec, seq: int, buf: memoryview) -> None:
        await self._send_msgs(spec, [(seq, buf)])

    async def _recv_msg(self, spec: TransferSpec, seq: int, buf: memoryview) -> None:
        await self._recv_msgs(spec, [(seq, buf)], lambda _i: None)

    async def _send_msgs(self, spec: TransferSpec, msgs: list[tuple[int, memoryview]]) -> None:
        peer, byte = self._peer(spec), self._mpi.BYTE
        await self._wait([self._comm.Isend([buf, byte], dest=peer, tag=self._tag(spec, seq)) for seq, buf in msgs])

    async def _recv_msgs(
        self, spec: TransferSpec, msgs: list[tuple[int, memoryview]], landed: Callable[[int], None]
    ) -> None:
        peer, byte = self._peer(spec), self._mpi.BYTE
        requests = [self._comm.Irecv([buf, byte], source=peer, tag=self._tag(spec, seq)) for seq, buf in msgs]
        await self._wait(requests, landed)

    # ---- same-host single copy (module doc) -------------------------------------------------
    def _single_copy_for(self, spec: TransferSpec) -> bool:
        """Whether this transfer's data is written by the sender (same-host pair, and big
        enough that the plan's round trip pays for itself)."""
        return spec.total_bytes >= SINGLE_COPY_MIN_BYTES and self._peer(spec) in self._single_copy

    def _message_runs(self, spec: TransferSpec) -> list[range]:
        runs = super()._message_runs(spec)
        if self._single_copy_for(spec):  # NOTE: finer, so the last message's hash is short
            return split_runs(runs, spec.nbytes, SINGLE_COPY_MESSAGE_BYTES)
        return runs

    async def _recv_data(self, spec: TransferSpec, msgs: list[tuple[int, memoryview]], landed: Landed) -> None:
        peer = self._peer(spec)
        if not self._single_copy_for(spec):
            return await self._recv_msgs(spec, msgs, landed)
        token = np.array([spec.transfer_id + 1], np.int64)
        plan = np.array([token.ctypes.data, int(token[0])] + [
            x for seq, buf in msgs for x in (seq, np.frombuffer(buf, np.uint8).ctypes.data, buf.nbytes)
        ], np.int64)  # fmt: skip
        notices = np.zeros(len(msgs), np.uint8)
        byte = self._mpi.BYTE
        requests = [self._comm.Irecv([notices[i : i + 1], byte], source=peer, tag=self._tag(spec, seq))
                    for i, (seq, _) in enumerate(msgs)]  # fmt: skip
        requests.append(self._comm.Isend([plan, self._mpi.INT64_T], dest=peer, tag=self._tag(spec, _PLAN_SEQ)))

        def written(i: int) -> None:
            if i == len(msgs):
                return
            if notices[i] != _WRITTEN:
                raise TransportError(f"mpi: rank {peer} could not write message {msgs[i][0]} into this rank")
            landed(i)

        finished = False
        try:
            await self._wait(requests, written)
            finished = True
            self.single_copy_receives += 1
        finally:
            token[0] = 0  # NOTE: a sender that has not begun a message now refuses to write it
            if not finished:
                self._orphans.append((token, plan, [buf for _, buf in msgs]))

    async def _send_data(self, spec: TransferSpec, msgs: list[tuple[int, memoryview]]) -> None:
        peer = self._peer(spec)
        if not self._single_copy_for(spec) or not msgs:
            return await self._send_msgs(spec, msgs)
        plan = await asyncio.shield(self._plan(spec, peer))
        token = np.int64(plan.token).tobytes()
        status = np.array([_WRITTEN, _FAILED], np.uint8)
        notices = []
        for seq, buf in msgs:
            address, room = plan.targets.get(seq, (0, -1))
            if room < buf.nbytes:
                raise TransportError(f"mpi: rank {peer} planned no room for message {seq} of {buf.nbytes} bytes")
            try:
                if cma.read(self._pids[peer], plan.token_address, len(token)) != token:
                    raise TransportError(f"mpi: rank {peer} no longer waits for transfer {spec.transfer_id}")
                cma.write(self._pids[peer], address, np.frombuffer(buf, np.uint8).ctypes.data, buf.nbytes)
            except cma.CrossMemoryError as exc:
                self._comm.Isend([status[1:], self._mpi.BYTE], dest=peer, tag=self._tag(spec, seq))
                raise TransportError(f"mpi: writing message {seq} into rank {peer} failed: {exc}") from None
            notices.append(self._comm.Isend([status[:1], self._mpi.BYTE], dest=peer, tag=self._tag(spec, seq)))
            await asyncio.sleep(0)
        await self._wait(notices)

    def _plan(self, spec: TransferSpec, peer: int) -> asyncio.Future[_Plan]:
        """The receiver's plan for this transfer, fetched once however many sends need it.
        NOTE: the receive is posted at once, so the plan lands while the header is encoded."""
        key = (peer, spec.transfer_id)
        task = self._plans.get(key)
        if task is None:
            words = np.empty(_Plan.words(len(self._message_runs(spec))), np.int64)
            request = self._comm.Irecv([words, self._mpi.INT64_T], source=peer, tag=self._tag(spec, _PLAN_SEQ))

            async def fetch() -> _Plan:
                await self._wait([request])
                return _Plan.decode(words)

            task = self._plans[key] = asyncio.ensure_future(fetch())
        return task

    def _sent(self, spec: TransferSpec) -> None:
        task = self._plans.pop((self._peer(spec), spec.transfer_id), None)
        if task is not None:
            task.cancel()

    async def _aclose(self) -> None:
        self._orphans.clear()
        self._comm.Free()
