"""MPI transport (mpi4py point-to-point on raw buffers, never pickled objects).

For processes of one MPI world started by ``mpirun``/``srun``. A peer is named by its rank in
the communicator. Each transport owns a duplicate of the communicator, so its messages never
match anyone else's. Messages of one transfer use tags ``(transfer_id mod 2047) · 2^20 + seq``.
All data messages of a transfer are posted at once (``Isend``/``Irecv`` on contiguous
buffers, so Open MPI's single-copy shared-memory path applies) and each is verified as it
completes. (One ``hindexed`` message over scattered blocks was measured slower here: Open MPI
packs non-contiguous datatypes through its two-copy path.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from transport.base import TransferSpec, TransportConfig
from transport.errors import PeerUnreachable, TransportError
from transport.message import MessageTransport

__all__ = ["MpiTransport"]

_SEQ_BITS = 20
_SPIN_S = 2.0


class MpiTransport(MessageTransport):
    """Args: ``comm``: communicator to duplicate (default ``MPI.COMM_WORLD``)."""

    name = "mpi"

    def __init__(self, config: TransportConfig | None = None, comm: Any = None) -> None:
        super().__init__(config)
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        self._rank = self._comm.Get_rank()
        self._size = self._comm.Get_size()

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

    async def _aclose(self) -> None:
        self._comm.Free()
