"""UCX transport over UCXX (``import ucxx``; the maintained successor of ucx-py).

Peers are named by their UCX *worker address* (hex), exchanged out of band (the KV manager
carries it; tests pass it directly). Connecting by worker address with endpoint error
handling off lets UCX pick shared memory (``cma``) for same-host peers and tcp / InfiniBand
``rc`` across hosts; with error handling on, UCX restricts itself to transports that report
peer failure and falls back to tcp even on one host (≈10× slower here). So error handling is
off by default and a dead peer is detected by the transfer deadline instead
(:class:`TransferTimeout`), which the base class enforces on every send and receive.

The receiver needs no endpoint: it receives on its worker by tag. A tag is
``xxh64(sender address, transfer_id)`` with the low 20 bits replaced by the message's
sequence number, so concurrent transfers from different senders never match each other.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import xxhash

from transport.base import TransferSpec, TransportConfig
from transport.errors import PeerUnreachable, TransportError
from transport.message import MessageTransport
from transport.ucx_query import endpoint_transports

__all__ = ["UcxTransport"]

_SEQ_BITS = 20


class UcxTransport(MessageTransport):
    """Args: ``error_handling``: UCX endpoint error handling (see module doc; default off).
    ``net_devices``: the network devices UCX may open (UCX's ``NET_DEVICES``, e.g. ``"lo"``
    or ``"mlx5_0:1,eth0"``); ``""`` takes ``GRAPHFLOW_UCX_NET_DEVICES`` from the environment,
    else UCX's default (all). Restrict it to the cluster network in deployments.
    ``busy_poll``: poll for completions instead of waiting on futures (see ``_init``)."""

    name = "ucx"

    def __init__(
        self,
        config: TransportConfig | None = None,
        error_handling: bool = False,
        net_devices: str = "",
        busy_poll: bool = False,
    ) -> None:
        super().__init__(config)
        os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
        import ucxx

        self._ucxx = ucxx
        self.error_handling = error_handling
        self.net_devices = net_devices or os.environ.get("GRAPHFLOW_UCX_NET_DEVICES", "")
        self.busy_poll = busy_poll
        self._endpoints: dict[str, Any] = {}
        # NOTE: each peer's lanes (transport/device) are queried once, on the loop thread as the endpoint is
        # made: UCX's worker is single-threaded, and stats are read from other threads
        self._routes: dict[str, tuple[str, ...]] = {}
        # NOTE: buffers of messages abandoned on timeout stay referenced until close(), so a
        # late arrival can never write into freed memory.
        self._orphans: list[Any] = []
        self._address: str = self.run(self._init())

    async def _init(self) -> str:
        # NOTE: UCX options are per process: the first transport created in a process sets them
        # NOTE: by default requests complete Python futures from UCXX's notifier thread; with
        # busy_poll, awaiting a request polls in a loop instead: ~0.5 ms less latency per small
        # message, but a replica waiting for a transfer burns a whole core (measured here: 6.1
        # CPU-s during a 6 s wait, vs 0.12 CPU-s), which on a small machine starves compute
        options = {"NET_DEVICES": self.net_devices} if self.net_devices else {}
        self._ucxx.init(options=options, enable_python_future=not self.busy_poll)
        self._ucxx.core._get_ctx().continuous_ucx_progress()
        return bytes(self._ucxx.get_worker_address()).hex()

    @property
    def address(self) -> str:
        return self._address

    def net_devices_in_use(self) -> str:
        """What UCX was configured with (``NET_DEVICES``), as UCX reports it."""
        return str(self._ucxx.get_config().get("NET_DEVICES", ""))

    def _tag(self, sender: str, spec: TransferSpec, seq: int) -> Any:
        if seq >= 1 << _SEQ_BITS:
            raise ValueError(f"ucx: at most {(1 << _SEQ_BITS) - 2} data messages per transfer")
        base = xxhash.xxh64_intdigest(f"{sender}:{spec.transfer_id}".encode())
        return self._ucxx.types.Tag((base & ~((1 << _SEQ_BITS) - 1)) | seq)

    async def _endpoint(self, peer: str) -> Any:
        ep = self._endpoints.get(peer)
        if ep is not None:
            return ep
        try:
            address = self._ucxx.get_ucx_address_from_buffer(bytes.fromhex(peer))
            ep = await self._ucxx.create_endpoint_from_worker_address(
                address, endpoint_error_handling=self.error_handling
            )
        except Exception as exc:  # noqa: BLE001 - any failure here means the peer can't be reached
            raise PeerUnreachable(f"ucx: cannot connect to worker address {peer[:32]}…: {exc}") from None
        self._endpoints[peer] = ep
        self._routes[peer] = endpoint_transports(ep.ucp_endpoint)
        return ep

    def routes(self) -> dict[str, tuple[str, ...]]:
        """The transports UCX chose for each peer connected to (``ucp_ep_query``)."""
        return dict(self._routes)

    def forget_peer(self, peer: str) -> bool:
        """Abort the endpoint to ``peer`` (on the loop thread: UCX's worker is single-threaded),
        releasing what it holds of the peer (for a same-host peer, its shared-memory segments)."""

        async def forget() -> bool:
            self._routes.pop(peer, None)
            ep = self._endpoints.pop(peer, None)
            if ep is None:
                return False
            ep.abort()
            return True

        return self.run(forget())

    async def _guard(self, aw: Any, bufs: list[memoryview], peer: str) -> None:
        try:
            await aw
        except asyncio.CancelledError:
            self._orphans.append(bufs)
            raise
        except self._ucxx.exceptions.UCXError as exc:
            self._orphans.append(bufs)
            raise TransportError(f"ucx: transfer with {peer[:32]}… failed: {exc}") from None

    async def _send_msg(self, spec: TransferSpec, seq: int, buf: memoryview) -> None:
        ep = await self._endpoint(spec.peer)
        await self._guard(ep.send(buf, tag=self._tag(self._address, spec, seq), force_tag=True), [buf], spec.peer)

    async def _recv_msg(self, spec: TransferSpec, seq: int, buf: memoryview) -> None:
        await self._guard(self._ucxx.recv(buf, tag=self._tag(spec.peer, spec, seq)), [buf], spec.peer)

    async def _send_msgs(self, spec: TransferSpec, msgs: list[tuple[int, memoryview]]) -> None:
        ep = await self._endpoint(spec.peer)
        sends = [ep.send(buf, tag=self._tag(self._address, spec, seq), force_tag=True) for seq, buf in msgs]
        await self._guard(asyncio.gather(*sends), [buf for _, buf in msgs], spec.peer)

    async def _recv_msgs(
        self, spec: TransferSpec, msgs: list[tuple[int, memoryview]], landed: Callable[[int], None]
    ) -> None:
        async def one(i: int, seq: int, buf: memoryview) -> None:
            await self._ucxx.recv(buf, tag=self._tag(spec.peer, spec, seq))
            landed(i)  # NOTE: verifies message i while later messages are still arriving

        bufs = [buf for _, buf in msgs]
        await self._guard(asyncio.gather(*(one(i, seq, buf) for i, (seq, buf) in enumerate(msgs))), bufs, spec.peer)

    async def _aclose(self) -> None:
        for ep in self._endpoints.values():
            ep.abort()
        self._endpoints.clear()
        self._routes.clear()
        self._orphans.clear()
