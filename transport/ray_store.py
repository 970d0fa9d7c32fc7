"""Ray object-store transport: blocks go through Ray's shared-memory object store.

The sender ``ray.put``\\s one object holding every block as a numpy view of its tensor (one
copy into the store; a torch tensor put directly is pickled and copied again, ≈0.65 s per
64 MiB here) and posts the header plus the object ref to a small named mailbox actor. The receiver takes them from
the mailbox and ``get``\\s the arrays, which are zero-copy read-only views of the store's
shared memory; without ``into`` the received tensors *are* those views (blocks are immutable:
appending copies), with ``into`` they are copied into the given tensors. Checksums are
verified either way. A sender that dies before the receiver gets its objects makes them
unreachable: that surfaces as :class:`TransportError`. The mailbox holds a posted transfer
for twice the sender's deadline at most, and refuses one whose receiver already gave up.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from transport.base import Received, TransferSpec, TransferStats, Transport, TransportConfig
from transport.checksums import tensor_bytes, verify
from transport.errors import TransferTimeout, TransportError, WireFormatError
from transport.wire import BlockHeader, decode_header, encode_header

__all__ = ["MAILBOX_NAME", "RayTransport"]

MAILBOX_NAME = "graphflow-transport-mailbox"
NAMESPACE = "graphflow"


class _Mailbox:
    """Rendezvous of (sender, receiver, transfer) → (header, object refs); runs as a Ray actor.

    Nothing stays forever: a posted transfer nobody takes within its ``ttl_s`` is dropped
    (its refs released, so the store can free the blocks), and a post for a transfer whose
    receiver already gave up is refused, which the sender reports as a failed transfer.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._slots: dict[tuple[str, str, int], asyncio.Future[Any]] = {}
        self._expires: dict[tuple[str, str, int], float] = {}  # posted, not yet taken
        self._gone: dict[tuple[str, str, int], float] = {}  # receiver gave up; refuse posts until then
        self._clock = clock

    def _slot(self, key: tuple[str, str, int]) -> asyncio.Future[Any]:
        if key not in self._slots:
            self._slots[key] = asyncio.get_running_loop().create_future()
        return self._slots[key]

    def _expire(self) -> None:
        now = self._clock()
        for key in [k for k, t in self._expires.items() if t <= now]:
            del self._expires[key]
            self._slots.pop(key, None)
        for key in [k for k, t in self._gone.items() if t <= now]:
            del self._gone[key]

    async def post(self, key: tuple[str, str, int], header: bytes, refs: list[Any], ttl_s: float = 3600.0) -> bool:
        """Leave a transfer for its receiver; ``False`` (nothing kept) if the receiver gave up."""
        self._expire()
        if key in self._gone:
            return False
        self._slot(key).set_result((header, refs))
        self._expires[key] = self._clock() + ttl_s
        return True

    async def take(self, key: tuple[str, str, int], timeout_s: float) -> Any:
        self._expire()
        try:
            return await asyncio.wait_for(self._slot(key), timeout_s)
        except TimeoutError:
            self._gone[key] = self._clock() + max(timeout_s, 60.0)
            raise
        finally:
            self._slots.pop(key, None)
            self._expires.pop(key, None)

    async def abandon(self, key: tuple[str, str, int], hold_s: float = 60.0) -> None:
        """The receiver gave up: drop what was posted (its refs released) and refuse posts for
        ``hold_s``."""
        self._gone[key] = self._clock() + hold_s
        self._expires.pop(key, None)
        slot = self._slots.pop(key, None)
        if slot is not None and not slot.done():
            slot.cancel()

    def held(self) -> int:
        """Transfers posted and not yet taken (their blocks are pinned in the object store)."""
        self._expire()
        return len(self._expires)


class RayTransport(Transport):
    """Needs a connected Ray (``ray.init`` done by the caller, e.g. the runtime)."""

    name = "ray"

    def __init__(self, config: TransportConfig | None = None, name: str | None = None) -> None:
        super().__init__(config)
        import ray

        if not ray.is_initialized():
            raise TransportError("ray: not connected; call ray.init() (or graphflow's cluster.start) first")
        self._ray = ray
        self._address = name or f"ray-{uuid.uuid4().hex[:12]}"
        actor: Any = ray.remote(_Mailbox)
        self._mailbox = actor.options(
            name=MAILBOX_NAME,
            namespace=NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=1000,
        ).remote()

    @property
    def address(self) -> str:
        return self._address

    async def asend(
        self, spec: TransferSpec, headers: Sequence[BlockHeader], tensors: Sequence[torch.Tensor]
    ) -> TransferStats:
        self._check_spec(spec, headers)
        start = time.perf_counter()

        async def run() -> None:
            # NOTE: one object holding every block (a list of numpy views: pickle-5 out-of-band
            # buffers, one copy into the store); a put per block costs ~ms each.
            arrays = [tensor_bytes(t.cpu() if t.device.type != "cpu" else t) for t in tensors]
            refs = [self._ray.put(arrays)]
            key = (self._address, spec.peer, spec.transfer_id)
            # NOTE: kept for the receiver for twice our deadline, then dropped (nothing is pinned forever)
            ttl_s = 2 * self.config.timeout_s + 5.0
            if not await self._mailbox.post.remote(key, encode_header(headers), refs, ttl_s):
                raise TransportError(
                    f"ray: the receiver {spec.peer} gave up on transfer {spec.transfer_id} before it was sent"
                )

        await self._deadline(self._wrap(run()), f"send of {spec.total_bytes} bytes to {spec.peer}")
        return TransferStats(self.name, spec.total_bytes, len(headers), time.perf_counter() - start)

    async def arecv(self, spec: TransferSpec, into: Sequence[torch.Tensor] | None = None) -> Received:
        limits = self.config.limits
        if spec.total_bytes > limits.max_total_bytes:
            raise WireFormatError(f"spec announces {spec.total_bytes} bytes, limit is {limits.max_total_bytes}")
        start = time.perf_counter()

        async def run() -> Received:
            key = (spec.peer, self._address, spec.transfer_id)
            # NOTE: the mailbox waits a little longer than our own deadline, so a missing sender
            # always surfaces here as TransferTimeout (not as the actor's own timeout error).
            header, refs = await self._mailbox.take.remote(key, self.config.timeout_s + 5.0)
            headers = decode_header(header, limits)
            self._check_received(spec, headers)
            (arrays,) = await asyncio.gather(*refs)
            if len(arrays) != len(headers):
                raise WireFormatError(f"ray: {len(arrays)} buffers arrived for {len(headers)} blocks")
            tensors = self._as_tensors(headers, arrays, into)
            for h, t in zip(headers, tensors, strict=True):
                verify(h, t)
            if self.config.device != "cpu":
                tensors = [t.to(self.config.device) for t in tensors]
            return Received(headers, tensors, TransferStats(self.name, spec.total_bytes, len(headers), 0.0))

        try:
            got = await self._deadline(self._wrap(run()), f"receive of {spec.total_bytes} bytes from {spec.peer}")
        except TransferTimeout:
            # NOTE: told, not awaited: a sender posting from now on is refused instead of pinning its blocks
            self._mailbox.abandon.remote((spec.peer, self._address, spec.transfer_id))
            raise
        stats = TransferStats(self.name, spec.total_bytes, len(got.headers), time.perf_counter() - start)
        return Received(got.headers, got.tensors, stats)

    def _as_tensors(
        self, headers: Sequence[BlockHeader], arrays: Sequence[np.ndarray], into: Sequence[torch.Tensor] | None
    ) -> list[torch.Tensor]:
        from transport.base import check_into
        from transport.wire import dtype_from_name

        if into is not None:
            out = check_into(headers, into)
            for t, a in zip(out, arrays, strict=True):
                np.copyto(tensor_bytes(t), a)
            return out
        with warnings.catch_warnings():
            # NOTE: the store's buffers are read-only; blocks are never written in place.
            warnings.simplefilter("ignore", UserWarning)
            return [
                torch.from_numpy(a).view(dtype_from_name(h.dtype)).reshape(h.shape)
                for h, a in zip(headers, arrays, strict=True)
            ]

    async def _wrap(self, coro: Any) -> Any:
        try:
            return await coro
        except (TransportError, ValueError):
            raise
        except self._ray.exceptions.RayError as exc:
            raise TransportError(f"ray: transfer failed: {type(exc).__name__}: {str(exc)[:200]}") from None
