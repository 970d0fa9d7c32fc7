from __future__ import annotations

import concurrent.futures as cf
import gc
import threading
import time
import weakref
from dataclasses import replace

import pytest
import torch

from transport import local, message, wire
from transport.base import TransferSpec, TransportConfig
from transport.checksums import checksum, tensor_bytes
from transport.errors import ChecksumMismatch, PeerUnreachable, TransferAborted, TransferTimeout, WireFormatError
from transport.layout import MESSAGE_BYTES, message_runs
from transport.local import LocalTransport
from transport.memory import host_arena
from transport.pool import TensorPool
from transport.wire import WireLimits

from .test_wire import _header


@pytest.fixture
def pair():
    config = TransportConfig(timeout_s=2.0)
    a, b = LocalTransport(config), LocalTransport(config)
    yield a, b
    a.close()
    b.close()


def _blocks(n: int = 3):
    tensors = [torch.randn(2, 2, 2, 16, 4, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    headers = [replace(_header(t), key=i + 1) for i, t in enumerate(tensors)]
    return headers, tensors


def _transfer(pair, headers, tensors, recv_spec=None, into=None):
    a, b = pair
    send_spec = TransferSpec.for_headers(1, b.address, headers)
    errors = []

    def send():
        try:
            a.send(send_spec, headers, tensors)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        return b.recv(recv_spec or TransferSpec.for_headers(1, a.address, headers), into=into)
    finally:
        sender.join()


def test_blocks_arrive_bit_identical(pair):
    headers, tensors = _blocks()
    got = _transfer(pair, headers, tensors)
    assert got.headers == headers
    assert all(torch.equal(x, y) for x, y in zip(got.tensors, tensors, strict=True))
    assert got.stats.nbytes == sum(h.nbytes for h in headers) and got.stats.blocks == 3


def test_receive_into_pooled_tensors(pair):
    headers, tensors = _blocks()
    pool = TensorPool()
    into = pool.take_for(headers)
    got = _transfer(pair, headers, tensors, into=into)
    assert all(g is i for g, i in zip(got.tensors, into, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(into, tensors, strict=True))
    pool.give(into)
    assert pool.take(headers[0].shape, torch.float32) is into[-1]


def test_flipped_byte_is_a_checksum_mismatch(pair):
    headers, tensors = _blocks()
    corrupted = [t.clone() for t in tensors]
    tensor_bytes(corrupted[1])[17] ^= 0x10
    assert checksum(corrupted[1]) != headers[1].checksum
    with pytest.raises(ChecksumMismatch):
        _transfer(pair, headers, corrupted)


def test_header_announcing_other_blocks_is_rejected(pair):
    headers, tensors = _blocks()
    a, _ = pair
    expected = TransferSpec(1, a.address, (9, 9, 9), tuple(h.nbytes for h in headers))
    with pytest.raises(WireFormatError, match="does not announce"):
        _transfer(pair, headers, tensors, recv_spec=expected)


def test_absurd_sizes_rejected_before_allocating(pair):
    _, b = pair
    terabyte = TransferSpec(1, "x", (1,), (1 << 40,))
    with pytest.raises(WireFormatError, match="limits"):
        b.recv(terabyte)
    small = LocalTransport(TransportConfig(timeout_s=1, limits=WireLimits(max_total_bytes=1000)))
    try:
        with pytest.raises(WireFormatError):
            small.recv(TransferSpec(1, "x", (1,), (4096,)))
    finally:
        small.close()


def test_missing_sender_times_out(pair):
    a, b = pair
    with pytest.raises(TransferTimeout, match="within 2 s"):
        b.recv(TransferSpec(5, a.address, (1,), (64,)))


def test_a_side_that_gave_up_is_not_matched_later(pair):
    a, b = pair
    headers, tensors = _blocks()
    a.config = b.config = TransportConfig(timeout_s=0.2)
    with pytest.raises(TransferTimeout):  # the receive gives up; a late send finds no receiver
        b.recv(TransferSpec.for_headers(6, a.address, headers))
    with pytest.raises(TransferTimeout):
        a.send(TransferSpec.for_headers(6, b.address, headers), headers, tensors)
    with pytest.raises(TransferTimeout):  # and the late receive of that send finds no sender
        b.recv(TransferSpec.for_headers(6, a.address, headers))
    assert not local._FABRIC.channels


def test_an_aborted_receive_stops_at_once_and_its_slots_are_withdrawn(pair):
    a, b = pair
    headers, tensors = _blocks()
    a.config = b.config = TransportConfig(timeout_s=30.0)
    spec = TransferSpec.for_headers(9, a.address, headers)
    waiting = cf.ThreadPoolExecutor(1).submit(b.recv, spec)
    time.sleep(0.2)  # the receive is posted and waiting for a sender that failed
    begin = time.perf_counter()
    b.abort_recv(9, "the sender lost its blocks")
    with pytest.raises(TransferAborted, match="the sender lost its blocks"):
        waiting.result(timeout=5)
    assert time.perf_counter() - begin < 2.0
    a.config = b.config = TransportConfig(timeout_s=0.2)
    with pytest.raises(TransferTimeout):  # a late send finds no receiver waiting
        a.send(TransferSpec.for_headers(9, b.address, headers), headers, tensors)
    assert not local._FABRIC.channels


def test_a_receive_aborted_before_it_starts_fails_when_it_does(pair):
    a, b = pair
    b.abort_recv(11, "the sender failed")
    with pytest.raises(TransferAborted, match="transfer 11 aborted: the sender failed"):
        b.recv(TransferSpec(11, a.address, (1,), (64,)))
    headers, tensors = _blocks(1)  # the abort is used up: the next transfer of that id runs
    a.config = b.config = TransportConfig(timeout_s=5.0)
    sent = cf.ThreadPoolExecutor(1).submit(a.send, TransferSpec.for_headers(11, b.address, headers), headers, tensors)
    got = b.recv(TransferSpec.for_headers(11, a.address, headers))
    sent.result(timeout=5)
    assert torch.equal(got.tensors[0], tensors[0])


def test_unknown_peer(pair):
    a, _ = pair
    headers, tensors = _blocks(1)
    with pytest.raises(PeerUnreachable):
        a.send(TransferSpec.for_headers(1, "nobody", headers), headers, tensors)


def test_spec_must_match_headers(pair):
    a, b = pair
    headers, tensors = _blocks(2)
    with pytest.raises(ValueError, match="do not match"):
        a.send(TransferSpec(1, b.address, (1,), (4,)), headers, tensors)


def _big_blocks(n: int, nbytes: int, laid_out: bool) -> tuple[list, list[torch.Tensor]]:
    """``n`` float32 blocks of ``nbytes``: back to back in block memory, or separate tensors."""
    shape = (nbytes // 4,)
    separate = [torch.empty(shape) for _ in range(n)]
    tensors = host_arena().empty_run([shape] * n, torch.float32) if laid_out else separate
    for i, t in enumerate(tensors):
        t.copy_(torch.randn(shape, generator=torch.Generator().manual_seed(i)))
    headers = [replace(_header(t), key=i + 1, token_ids=()) for i, t in enumerate(tensors)]
    return headers, tensors


def test_transfer_of_several_messages_lands_in_message_spans(pair):
    per_message = MESSAGE_BYTES >> 20
    headers, tensors = _big_blocks(2 * per_message + 2, 1 << 20, laid_out=False)  # 1 MiB blocks: 2½ messages
    got = _transfer(pair, headers, tensors)
    assert all(torch.equal(x, y) for x, y in zip(got.tensors, tensors, strict=True))
    runs = message_runs([h.nbytes for h in headers])
    assert [len(r) for r in runs] == [per_message, per_message, 2]
    for run in runs:  # each message's blocks are views of one span, back to back
        ptrs = [got.tensors[i].data_ptr() for i in run]
        assert ptrs == [ptrs[0] + k * (1 << 20) for k in range(len(run))]


def test_back_to_back_blocks_are_sent_in_place(pair, monkeypatch):
    def no_gather(*_args: object) -> None:
        raise AssertionError("blocks laid out back to back must not be gathered")

    headers, tensors = _big_blocks(6, 1 << 20, laid_out=True)
    monkeypatch.setattr(message, "_gather", no_gather)
    got = _transfer(pair, headers, tensors)
    assert all(torch.equal(x, y) for x, y in zip(got.tensors, tensors, strict=True))


def test_scattered_blocks_are_gathered_and_scattered(pair, monkeypatch):
    gathered = []
    real_gather = message._gather
    monkeypatch.setattr(message, "_gather", lambda blocks, total: gathered.append(total) or real_gather(blocks, total))
    n = (MESSAGE_BYTES >> 20) + 2
    headers, tensors = _big_blocks(n, 1 << 20, laid_out=False)
    into = [torch.zeros_like(t) for t in tensors]  # separate tensors: lands in staging, then scattered
    got = _transfer(pair, headers, tensors, into=into)
    assert gathered == [MESSAGE_BYTES, 2 << 20]
    assert all(g is i for g, i in zip(got.tensors, into, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(into, tensors, strict=True))


def test_corrupt_block_in_a_later_message_is_caught_and_not_scattered(pair):
    n = (MESSAGE_BYTES >> 20) + 2
    headers, tensors = _big_blocks(n, 1 << 20, laid_out=False)
    tensors[-1] = tensors[-1].clone()
    tensor_bytes(tensors[-1])[123] ^= 0x01
    into = [torch.zeros_like(t) for t in tensors]
    with pytest.raises(ChecksumMismatch):
        _transfer(pair, headers, tensors, into=into)
    assert not into[-2].any() and not into[-1].any()  # the bad message never reached the caller's tensors


def test_message_views_keep_their_memory_alive():
    # a backend keeps the views of abandoned messages until it closes; they must pin the memory
    owner = [torch.arange(16, dtype=torch.uint8)]
    alive = weakref.ref(owner[0])
    view = message._address_view(owner[0].data_ptr(), 16, owner)
    del owner
    gc.collect()
    assert alive() is not None and bytes(view[:3]) == b"\x00\x01\x02"
    del view
    gc.collect()
    assert alive() is None


def test_blocks_of_different_shapes_in_one_message_keep_their_shapes(pair):
    shapes = [(2, 2, 2, 16, 4), (2, 2, 2, 16, 4), (2, 2, 2, 5, 4), (3, 7)]
    tensors = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(shapes)]
    headers = [replace(_header(t), key=i + 1, token_ids=()) for i, t in enumerate(tensors)]
    got = _transfer(pair, headers, tensors)
    assert [tuple(t.shape) for t in got.tensors] == shapes
    assert all(torch.equal(x, y) for x, y in zip(got.tensors, tensors, strict=True))


def test_endpoints_share_one_loop():
    a, b = LocalTransport(), LocalTransport()
    try:
        loop = a._ensure_loop()
        assert b._ensure_loop() is loop
        a.close()
        assert loop.is_running()  # b still uses it
    finally:
        b.close()


def test_shared_loop_stops_with_the_last_endpoint():
    fabric = local._Fabric()  # NOTE: a fabric of its own: other tests' endpoints may still be open
    fabric.endpoints |= {"x", "y"}
    loop, thread = fabric.shared_loop()
    assert fabric.shared_loop()[0] is loop
    fabric.leave("x")
    assert loop.is_running()
    fabric.leave("y")
    assert thread is not None and not thread.is_alive() and fabric.loop is None


def test_messages_of_a_big_transfer_are_landed_by_two_threads(pair, monkeypatch):
    threads: dict[int, str] = {}
    real = local._copy_in

    def slow_copy(seq, buf, src, sizes):
        threads[seq] = threading.current_thread().name
        time.sleep(0.05)  # NOTE: long enough that the copier thread surely takes a message
        return real(seq, buf, src, sizes)

    monkeypatch.setattr(local, "_copy_in", slow_copy)
    headers, tensors = _big_blocks(2 * (MESSAGE_BYTES >> 20), 1 << 20, laid_out=True)
    assert sum(h.nbytes for h in headers) >= local.SHARED_COPY_MIN_BYTES
    got = _transfer(pair, headers, tensors)
    assert all(torch.equal(x, y) for x, y in zip(got.tensors, tensors, strict=True))
    data = {seq: name for seq, name in threads.items() if seq >= 2}
    assert sorted(data) == [2, 3]
    assert len(set(data.values())) == 2 and any(n.startswith("transport-local-copy") for n in data.values())


def test_a_refused_message_fails_the_shared_copy_after_the_others_land():
    src = memoryview(bytearray(b"abcd" * 4))
    ok_dst, bad_dst = bytearray(16), bytearray(8)
    shared = local.SharedCopy([(2, memoryview(ok_dst), src, [16]), (3, memoryview(bad_dst), src, [16])])
    shared.work()
    assert bytes(ok_dst) == bytes(src)
    with pytest.raises(WireFormatError, match="message 3 has 16 bytes, at most 8"):
        shared.result()


def test_a_big_receive_that_gives_up_withdraws_every_message(pair):
    a, b = pair
    a.config = b.config = TransportConfig(timeout_s=0.2)
    headers, tensors = _big_blocks(2 * (MESSAGE_BYTES >> 20), 1 << 20, laid_out=True)
    with pytest.raises(TransferTimeout):
        b.recv(TransferSpec.for_headers(7, a.address, headers))
    assert not local._FABRIC.channels
    with pytest.raises(TransferTimeout):  # a late send finds no receiver
        a.send(TransferSpec.for_headers(7, b.address, headers), headers, tensors)


def test_releasing_a_sender_that_already_gave_up_is_not_an_error(pair):
    a, b = pair
    key = (a.address, b.address, 9, 2)
    slot = local._FABRIC.take(key)  # the receiver waits first
    local._FABRIC.post(key, memoryview(bytearray(16)))  # the sender arrives and is matched
    slot.copied.cancel()  # then its wait gives up (deadline) before the copy ends
    local._release(slot)  # NOTE: set_result on the cancelled future would raise InvalidStateError
    assert slot.copied.cancelled() and not local._FABRIC.channels


@pytest.mark.parametrize("block_bytes", [1 << 10, 3 << 20], ids=["one-data-message", "two-data-messages"])
def test_a_header_too_long_for_the_first_message_travels_as_message_one(pair, block_bytes):
    headers, tensors = _big_blocks(3, block_bytes, laid_out=True)
    headers = [replace(h, token_ids=tuple(range(i, i + 30_000))) for i, h in enumerate(headers)]  # ≈ 360 KB of ids
    assert len(wire.encode_header(headers)) > message.first_message_bytes(TransferSpec.for_headers(1, "x", headers))
    assert (len(message_runs([h.nbytes for h in headers])) == 1) == (block_bytes < MESSAGE_BYTES // 3)
    got = _transfer(pair, headers, tensors)
    assert got.headers == headers
    assert all(torch.equal(x, y) for x, y in zip(got.tensors, tensors, strict=True))


def test_one_data_message_goes_out_with_the_header_in_one_round(pair, monkeypatch):
    rounds: list[list[int]] = []
    real = LocalTransport._send_msgs

    async def recording(self, spec, msgs):
        rounds.append([seq for seq, _ in msgs])
        await real(self, spec, msgs)

    monkeypatch.setattr(LocalTransport, "_send_msgs", recording)
    headers, tensors = _blocks()
    _transfer(pair, headers, tensors)
    assert rounds == [[0, 2]]
    rounds.clear()
    headers, tensors = _big_blocks((MESSAGE_BYTES >> 20) + 1, 1 << 20, laid_out=True)  # two data messages
    _transfer(pair, headers, tensors)
    assert sorted(rounds) == [[0], [2], [3]]  # the first data message goes before the header is encoded
