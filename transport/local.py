"""Same-process transport: endpoints in one process hand buffers over and the receiver copies.

Used in tests and when producer and consumer share a process. Each message is a rendezvous:
the sender posts its buffer and waits; the receiver copies it into its pre-allocated tensor
(one ``memcpy``) and releases the sender. Endpoints find each other by name.

Every local endpoint of a process runs on one shared event-loop thread (started with the
first endpoint, stopped when the last one closes): a transfer's send and receive then meet on
one thread instead of handing each message between two (measured for 1 MiB: ≈ 1.1 ms with a
loop per endpoint, mostly thread wake-ups; see transport/README.md). From
``SHARED_COPY_MIN_BYTES`` on, the data messages of a transfer are landed by that thread and
one copier thread together, each taking the next message not yet taken: copying and hashing
release the GIL, so both cores work on one transfer (256 MiB went from ≈ 0.7 to ≈ 0.9 of a
bare ``numpy.copyto``; transport/README.md has the runs).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import itertools
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from transport.base import TransferSpec, TransportConfig, start_loop_thread
from transport.checksums import copy_with_digests
from transport.errors import PeerUnreachable, WireFormatError
from transport.message import Landed, MessageTransport
from transport.wire import message_runs

__all__ = ["SHARED_COPY_MIN_BYTES", "LocalTransport", "SharedCopy"]

_T = TypeVar("_T")

SHARED_COPY_MIN_BYTES = 4 << 20
"""A transfer's data messages are landed by two threads (``SharedCopy``) from this size on."""

_Key = tuple[str, str, int, int]  # (sender, receiver, transfer_id, seq)


@dataclass(slots=True)
class _Slot:
    posted: cf.Future[memoryview] = field(default_factory=cf.Future)
    copied: cf.Future[None] = field(default_factory=cf.Future)


@dataclass(slots=True)
class _Channel:
    """Messages of one (sender, receiver, transfer, seq), matched in FIFO order like MPI tags."""

    posted: deque[_Slot] = field(default_factory=deque)  # sent, no receiver yet
    waiting: deque[_Slot] = field(default_factory=deque)  # receiver waiting, nothing sent yet


class _Fabric:
    """Process-wide registry of local endpoints and in-flight messages."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.endpoints: set[str] = set()
        self.channels: dict[_Key, _Channel] = {}
        self.ids = itertools.count()
        self.loop: asyncio.AbstractEventLoop | None = None  # shared by every endpoint; see the module doc
        self.thread: threading.Thread | None = None
        self._copier: cf.ThreadPoolExecutor | None = None

    def copier(self) -> cf.ThreadPoolExecutor:
        """The one helper thread that lands messages alongside the loop thread (``SharedCopy``)."""
        with self.lock:
            if self._copier is None:
                self._copier = cf.ThreadPoolExecutor(1, thread_name_prefix="transport-local-copy")
            return self._copier

    def shared_loop(self) -> tuple[asyncio.AbstractEventLoop, threading.Thread | None]:
        """The endpoints' event loop, started on first use."""
        with self.lock:
            if self.loop is None:
                self.loop, self.thread = start_loop_thread("transport-local")
            return self.loop, self.thread

    def leave(self, name: str) -> None:
        """Unregister endpoint ``name``; the last one out stops the shared loop."""
        with self.lock:
            self.endpoints.discard(name)
            if self.endpoints or self.loop is None:
                return
            loop, thread, self.loop, self.thread = self.loop, self.thread, None, None
            copier, self._copier = self._copier, None
        if copier is not None:
            copier.shutdown(wait=False)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def post(self, key: _Key, buf: memoryview) -> _Slot:
        """Sender side: hand ``buf`` to the oldest waiting receiver, or queue it."""
        with self.lock:
            ch = self.channels.setdefault(key, _Channel())
            if ch.waiting:
                slot = ch.waiting.popleft()
            else:
                slot = _Slot()
                ch.posted.append(slot)
                slot.copied.add_done_callback(lambda f: self._withdraw(f, key, slot))
            slot.posted.set_result(buf)
            self._gc(key, ch)
            return slot

    def take(self, key: _Key) -> _Slot:
        """Receiver side: the oldest posted message, or a slot to wait on."""
        with self.lock:
            ch = self.channels.setdefault(key, _Channel())
            if ch.posted:
                slot = ch.posted.popleft()
            else:
                slot = _Slot()
                ch.waiting.append(slot)
                slot.posted.add_done_callback(lambda f: self._withdraw(f, key, slot))
            self._gc(key, ch)
            return slot

    def _withdraw(self, done: cf.Future[Any], key: _Key, slot: _Slot) -> None:
        """A side gave up on its queued slot (its future was cancelled, e.g. at its deadline):
        take the slot out, so that no later message of that key is matched with it."""
        if not done.cancelled():
            return  # NOTE: matched normally (and maybe called under the lock, from post())
        with self.lock:
            ch = self.channels.get(key)
            if ch is not None:
                for queue in (ch.posted, ch.waiting):
                    if slot in queue:
                        queue.remove(slot)
                self._gc(key, ch)

    def _gc(self, key: _Key, ch: _Channel) -> None:
        if not ch.posted and not ch.waiting:
            self.channels.pop(key, None)


_FABRIC = _Fabric()


async def _wait(fut: cf.Future[_T]) -> _T:
    """Await a fabric future. Like ``asyncio.wrap_future``, but a completion on the waiting
    loop's own thread (both endpoints on the shared loop, the usual case) wakes the waiter
    directly instead of through ``call_soon_threadsafe``, whose self-pipe write and extra
    loop turn cost more than the rest of a small message's hand-off. Cancelling the waiter
    cancels ``fut`` (the fabric then withdraws the slot)."""
    if fut.done():
        return fut.result()
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[_T] = loop.create_future()
    thread = threading.get_ident()

    def done(f: cf.Future[_T]) -> None:
        if threading.get_ident() == thread:
            _settle(f, waiter)
        else:
            loop.call_soon_threadsafe(_settle, f, waiter)

    fut.add_done_callback(done)
    try:
        return await waiter
    except asyncio.CancelledError:
        fut.cancel()
        raise


def _settle(src: cf.Future[_T], dst: asyncio.Future[_T]) -> None:
    if dst.done():
        return
    if src.cancelled():
        dst.cancel()
    elif (exc := src.exception()) is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.result())


def _release(slot: _Slot) -> None:
    """Let the sender of ``slot`` go. Its wait may have given up already (its deadline passed
    while the copy ran): then there is no one left to tell, and that is not the receiver's error."""
    with contextlib.suppress(cf.InvalidStateError):
        slot.copied.set_result(None)


def _copy_in(seq: int, buf: memoryview, src: memoryview, sizes: list[int] | None) -> list[int] | None:
    """Copy message ``seq`` from ``src`` into ``buf``; with its blocks' ``sizes``, hash each
    chunk as it is copied (``checksums.copy_with_digests``: verification then reads the bytes from
    cache, not from memory again) and return the blocks' digests."""
    if src.nbytes > buf.nbytes:
        raise WireFormatError(f"local: message {seq} has {src.nbytes} bytes, at most {buf.nbytes} expected")
    if sizes is not None and sum(sizes) == src.nbytes:
        return copy_with_digests(buf, src, sizes)
    # NOTE: control and header messages, or a short one (verification will reject it)
    np.copyto(np.frombuffer(buf, np.uint8, src.nbytes), np.frombuffer(src, np.uint8))
    return None


class SharedCopy:
    """The messages of one transfer, landed by two threads at once: each calls :meth:`work`,
    which takes the next message not yet taken until none is left. ``numpy.copyto`` and
    xxhash release the GIL, so the event-loop thread and the copier thread copy and hash on
    both cores (see transport/README.md for what it measured)."""

    def __init__(self, jobs: Sequence[tuple[int, memoryview, memoryview, list[int] | None]]) -> None:
        self.jobs = jobs
        self._next = itertools.count()  # NOTE: next() on a count is atomic under the GIL
        self._done: list[tuple[int, list[int] | None]] = []
        self._error: BaseException | None = None
        self._stopped = False

    def work(self) -> None:
        while not self._stopped and self._error is None and (i := next(self._next)) < len(self.jobs):
            try:
                self._done.append((i, _copy_in(*self.jobs[i])))
            except BaseException as exc:  # noqa: BLE001 - handed to result(), raised on the loop thread
                self._error = exc

    def stop(self) -> None:
        """Take no further message (a copy already started still finishes)."""
        self._stopped = True

    def result(self) -> list[tuple[int, list[int] | None]]:
        """Each landed message's index and digests; raises the first copy that was refused."""
        if self._error is not None:
            raise self._error
        return sorted(self._done, key=lambda done: done[0])


class LocalTransport(MessageTransport):
    """An endpoint named ``name`` (unique in the process; generated when omitted)."""

    name = "local"

    def __init__(self, config: TransportConfig | None = None, name: str | None = None) -> None:
        super().__init__(config)
        with _FABRIC.lock:
            self._name = name or f"local-{next(_FABRIC.ids)}"
            if self._name in _FABRIC.endpoints:
                raise ValueError(f"a local endpoint named {self._name!r} already exists; pick another name")
            _FABRIC.endpoints.add(self._name)

    @property
    def address(self) -> str:
        return self._name

    def _check_peer(self, peer: str) -> None:
        if peer not in _FABRIC.endpoints:
            raise PeerUnreachable(f"local: no endpoint named {peer!r} in this process")

    async def _send_msg(self, spec: TransferSpec, seq: int, buf: memoryview) -> None:
        self._check_peer(spec.peer)
        slot = _FABRIC.post((self._name, spec.peer, spec.transfer_id, seq), buf)
        await _wait(slot.copied)

    async def _recv_msg(self, spec: TransferSpec, seq: int, buf: memoryview) -> None:
        self._check_peer(spec.peer)
        await self._land(spec, seq, buf, None)

    async def _recv_msgs(self, spec: TransferSpec, msgs: list[tuple[int, memoryview]], landed: Landed) -> None:
        self._check_peer(spec.peer)
        runs = message_runs(spec.nbytes)
        sizes = [[spec.nbytes[b] for b in runs[seq - 2]] if 2 <= seq < 2 + len(runs) else None for seq, _ in msgs]
        if len(msgs) < 2 or sum(buf.nbytes for _, buf in msgs) < SHARED_COPY_MIN_BYTES:
            for i, (seq, buf) in enumerate(msgs):
                landed(i, await self._land(spec, seq, buf, sizes[i]))
            return
        slots = [_FABRIC.take((spec.peer, self._name, spec.transfer_id, seq)) for seq, _ in msgs]
        try:
            srcs = [await _wait(slot.posted) for slot in slots]
        except BaseException:
            for slot in slots:
                slot.posted.cancel()  # NOTE: withdraws the slots no message reached yet
            raise
        shared = SharedCopy([(seq, buf, src, n) for (seq, buf), src, n in zip(msgs, srcs, sizes, strict=True)])
        try:
            helper = _FABRIC.copier().submit(shared.work)
            try:
                shared.work()
                await _wait(helper)
            finally:
                shared.stop()
                cf.wait([helper])  # NOTE: even when cancelled: no copy may go on into buffers handed back
        finally:
            for slot in slots:
                _release(slot)  # NOTE: even when a copy is refused
        for i, digests in shared.result():
            landed(i, digests)

    async def _land(self, spec: TransferSpec, seq: int, buf: memoryview, sizes: list[int] | None) -> list[int] | None:
        """Wait for message ``seq`` and copy it into ``buf`` (:func:`_copy_in`)."""
        slot = _FABRIC.take((spec.peer, self._name, spec.transfer_id, seq))
        src = await _wait(slot.posted)
        try:
            return _copy_in(seq, buf, src, sizes)
        finally:
            _release(slot)  # NOTE: even when the copy is refused

    async def _send_msgs(self, spec: TransferSpec, msgs: list[tuple[int, memoryview]]) -> None:
        # NOTE: post every message at once, then wait; a rendezvous per message costs two
        # cross-thread wake-ups each.
        self._check_peer(spec.peer)
        slots = [_FABRIC.post((self._name, spec.peer, spec.transfer_id, seq), buf) for seq, buf in msgs]
        try:
            for slot in slots:
                await _wait(slot.copied)
        except BaseException:
            for slot in slots:
                slot.copied.cancel()  # NOTE: withdraws every message no receiver has taken yet
            raise

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop, self._thread = _FABRIC.shared_loop()
        return self._loop

    def close(self) -> None:
        """Unregister this endpoint (the shared loop stops with the last endpoint)."""
        self._loop = self._thread = None
        _FABRIC.leave(self._name)
