"""The single-copy layer between two endpoints of this process: the plan, the writes (into
this very process, through the kernel), the first-byte completions, the fallback and the
abandoned receive. No second process, no sockets: the messages go over the local fabric."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import torch

from transport import cma
from transport.base import TransferSpec, TransportConfig
from transport.checksums import checksum
from transport.errors import ChecksumMismatch, TransferTimeout, TransportError
from transport.layout import MESSAGE_BYTES
from transport.local import LocalTransport
from transport.message import MessageTransport
from transport.single_copy import SINGLE_COPY_MIN_BYTES, Sends, SingleCopyTransport
from transport.wire import BlockHeader

pytestmark = pytest.mark.skipif(not cma.available(), reason="cross-memory attach needs Linux")

BLOCK = 1 << 20


class _Tasks(Sends):
    def __init__(self, transport: MessageTransport, spec: TransferSpec) -> None:
        self._t, self._spec, self._tasks = transport, spec, []

    def post(self, seq, buf):
        self._tasks.append(asyncio.ensure_future(self._t._send_msgs(self._spec, [(seq, buf)])))

    async def done(self):
        await asyncio.gather(*self._tasks)


class _Endpoint(SingleCopyTransport, LocalTransport):
    """A local endpoint that takes part in single copy with every peer."""

    def _single_copy_pair(self, spec):
        return True

    def _sends(self, spec):
        return _Tasks(self, spec)


@pytest.fixture
def pair():
    a, b = _Endpoint(TransportConfig(timeout_s=2.0)), _Endpoint(TransportConfig(timeout_s=2.0))
    yield a, b
    a.close()
    b.close()


def _blocks(n: int, seed: int = 0) -> tuple[list[BlockHeader], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    tensors = [torch.randint(0, 255, (BLOCK,), dtype=torch.uint8, generator=g) for _ in range(n)]
    return [BlockHeader(i + 1, i, 0, (), "uint8", (BLOCK,), BLOCK, checksum(t)) for i, t in enumerate(tensors)], tensors


def _transfer(a, b, headers, tensors, tid=1, recv_headers=None, into=None):
    async def both():
        return await asyncio.gather(
            a.asend(TransferSpec.for_headers(tid, b.address, headers), headers, tensors),
            b.arecv(TransferSpec.for_headers(tid, a.address, recv_headers or headers), into=into),
            return_exceptions=True,
        )

    return a.run(both())


def test_sender_writes_every_message_and_the_blocks_arrive_intact(pair):
    a, b = pair
    headers, tensors = _blocks(MESSAGE_BYTES // BLOCK + 3)  # two data messages
    sent, got = _transfer(a, b, headers, tensors)
    assert a.single_copy_writes == 2 and b.single_copy_writes == 0
    assert all(torch.equal(x, y) for x, y in zip(got.tensors, tensors, strict=True))


def test_small_transfers_take_the_ordinary_path(pair):
    a, b = pair
    headers, tensors = _blocks(SINGLE_COPY_MIN_BYTES // BLOCK - 1)
    _, got = _transfer(a, b, headers, tensors)
    assert a.single_copy_writes == 0
    assert all(torch.equal(x, y) for x, y in zip(got.tensors, tensors, strict=True))


def test_a_refused_write_sends_the_message_instead(pair, monkeypatch):
    a, b = pair

    def refuse(*_args):
        raise cma.CrossMemoryError(1, "not permitted")

    monkeypatch.setattr(cma, "write", refuse)
    headers, tensors = _blocks(5)
    _, got = _transfer(a, b, headers, tensors)
    assert a.single_copy_writes == 0
    assert all(torch.equal(x, y) for x, y in zip(got.tensors, tensors, strict=True))


def test_written_bytes_are_still_verified(pair):
    a, b = pair
    headers, tensors = _blocks(5)
    lying = [replace(h, checksum=h.checksum ^ 1) if i == 3 else h for i, h in enumerate(headers)]
    _, got = _transfer(a, b, lying, tensors)
    assert isinstance(got, ChecksumMismatch) and a.single_copy_writes == 1


def test_a_sender_late_for_an_abandoned_receive_does_not_write(pair):
    a, b = pair
    headers, tensors = _blocks(5)
    into = [torch.zeros(BLOCK, dtype=torch.uint8) for _ in headers]
    b.config = TransportConfig(timeout_s=0.2)

    async def late():
        receiving = asyncio.ensure_future(b.arecv(TransferSpec.for_headers(9, a.address, headers), into=into))
        await asyncio.sleep(0)  # NOTE: the plan is on its way before the receive gives up
        with pytest.raises(TransferTimeout):
            await receiving
        return await a.asend(TransferSpec.for_headers(9, b.address, headers), headers, tensors)

    with pytest.raises(TransportError, match="no longer waits"):
        a.run(late())
    assert a.single_copy_writes == 0
    assert all(int(t.count_nonzero()) == 0 for t in into)
