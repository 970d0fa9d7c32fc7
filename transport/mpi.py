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
then verifies, one after the other. Transfers of ≥ 4 MiB between such ranks are written by the
sender instead (:mod:`transport.single_copy`), so the receiver verifies while the bytes move.
The pairs that may do this are found once, when the transport is created (collectively): each
rank reads a random cookie out of every other rank MPI places on its host
(``COMM_TYPE_SHARED``; :class:`transport.cma.Cookie`), and a pair uses it only when both
directions work and both ranks allow it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from transport import cma
from transport.base import TransferSpec, TransportConfig
from transport.errors import PeerUnreachable, TransportError
from transport.single_copy import Sends, SingleCopyTransport, single_copy_allowed

__all__ = ["MpiTransport"]

_SEQ_BITS = 20
_SPIN_S = 2.0


class MpiTransport(SingleCopyTransport):
    """Args: ``comm``: communicator to duplicate (default ``MPI.COMM_WORLD``); creating the
    transport is collective over it. ``single_copy``: let same-host senders write into the
    receiver (module doc); ``None`` reads ``GRAPHFLOW_SINGLE_COPY`` (``0`` turns it off),
    default on. A pair uses it only if both ranks allow it."""

    name = "mpi"

    def __init__(
        self, config: TransportConfig | None = None, comm: Any = None, single_copy: bool | None = None
    ) -> None:
        super().__init__(config)
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        self._rank = self._comm.Get_rank()
        self._size = self._comm.Get_size()
        # NOTE: any thread may drive MPI only at MPI_THREAD_MULTIPLE (mpi4py asks for it)
        self.runs_on_caller = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._single_copy = self._single_copy_peers(single_copy_allowed(single_copy))

    def _single_copy_peers(self, allowed: bool) -> frozenset[int]:
        """The ranks this one can write to and be written by: among the ranks MPI places on
        this host, those whose cookie this rank reads back and who read back its own
        (collective; exchanges stay within one host, so they do not grow with the world)."""
        node = self._comm.Split_type(self._mpi.COMM_TYPE_SHARED)
        try:
            cookie = self._cookie
            mine = np.array([self._rank, cookie.pid, cookie.address, *np.frombuffer(cookie.value, np.int64)], np.int64)
            everyone = np.empty((node.Get_size(), mine.size), np.int64)
            node.Allgather(mine, everyone)
            reach = np.zeros(node.Get_size(), np.uint8)
            for p, row in enumerate(everyone):
                rank, pid, address = (int(x) for x in row[:3])
                reach[p] = allowed and rank != self._rank and cma.Cookie.reachable(pid, address, row[3:].tobytes())
            both = np.empty((node.Get_size(), node.Get_size()), np.uint8)
            node.Allgather(reach, both)
            me = node.Get_rank()
            return frozenset(int(everyone[p, 0]) for p in range(node.Get_size()) if both[me, p] and both[p, me])
        finally:
            node.Free()

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
        sends = _RequestSends(self, spec)
        for seq, buf in msgs:
            sends.post(seq, buf)
        await sends.done()

    async def _recv_msgs(
        self, spec: TransferSpec, msgs: list[tuple[int, memoryview]], landed: Callable[[int], None]
    ) -> None:
        peer, byte = self._peer(spec), self._mpi.BYTE
        requests = [self._comm.Irecv([buf, byte], source=peer, tag=self._tag(spec, seq)) for seq, buf in msgs]
        await self._wait(requests, landed)

    def _single_copy_pair(self, spec: TransferSpec) -> bool:
        return self._peer(spec) in self._single_copy

    def _sends(self, spec: TransferSpec) -> Sends:
        return _RequestSends(self, spec)

    async def _aclose(self) -> None:
        await super()._aclose()
        self._comm.Free()


class _RequestSends(Sends):
    """``Isend`` each message as it is posted; one progress loop waits for them all (a task
    per message would poll MPI once per task and loop turn)."""

    def __init__(self, transport: MpiTransport, spec: TransferSpec) -> None:
        self._t, self._spec, self._peer = transport, spec, transport._peer(spec)
        self._requests: list[Any] = []

    def post(self, seq: int, buf: memoryview) -> None:
        t = self._t
        self._requests.append(t.comm.Isend([buf, t._mpi.BYTE], dest=self._peer, tag=t._tag(self._spec, seq)))

    async def done(self) -> None:
        await self._t._wait(self._requests)
