from __future__ import annotations

import io

import pytest
import torch

from transport.checksums import checksum, copy_with_digests
from transport.errors import ChecksumMismatch, WireFormatError
from transport.wire import BlockHeader, decode_header, encode_header, read_frame, write_frame


def _header(t: torch.Tensor, **kw: object) -> BlockHeader:
    fields = dict(
        key=7,
        parent_key=0,
        position_offset=0,
        token_ids=(1, 2),
        dtype="float32",
        shape=tuple(t.shape),
        nbytes=t.numel() * 4,
        checksum=checksum(t),
    )
    fields.update(kw)
    return BlockHeader(**fields)  # type: ignore[arg-type]


def test_header_round_trip():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    h = _header(t)
    assert decode_header(encode_header([h, h])) == [h, h]


def test_absurd_size_rejected_before_allocating():
    h = _header(torch.zeros(1), shape=(1 << 38,), nbytes=(1 << 38) * 4)  # 1 TiB
    with pytest.raises(WireFormatError, match="refusing to allocate"):
        decode_header(encode_header([h]))


def test_inconsistent_nbytes_rejected():
    h = _header(torch.zeros(4), nbytes=3)
    with pytest.raises(WireFormatError, match="does not match shape"):
        decode_header(encode_header([h]))


def test_garbage_header_rejected():
    with pytest.raises(WireFormatError, match="Arrow"):
        decode_header(b"not arrow at all")


def test_frame_round_trip_and_bitflip():
    t = torch.randn(2, 2, 2, 16, 4)
    buf = io.BytesIO()
    write_frame(buf, [_header(t)], [t])
    headers, tensors = read_frame(io.BytesIO(buf.getvalue()))
    assert torch.equal(tensors[0], t)
    data = bytearray(buf.getvalue())
    data[-1] ^= 0x80
    with pytest.raises(ChecksumMismatch):
        read_frame(io.BytesIO(bytes(data)))
    with pytest.raises(WireFormatError, match="truncated"):
        read_frame(io.BytesIO(buf.getvalue()[:-10]))


def test_rows_of_different_ranks_round_trip():
    t = torch.zeros(2, 3)
    rows = [_header(t), _header(torch.zeros(5), key=8, token_ids=(), shape=(5,), nbytes=20), _header(t, key=9)]
    assert decode_header(encode_header(rows)) == rows
    assert decode_header(encode_header([])) == []


def test_header_is_one_arrow_stream_and_any_stream_of_that_schema_decodes():
    import pyarrow as pa

    rows = [_header(torch.zeros(2, 3), key=k, dtype=d, nbytes=6 * s) for k, d, s in ((1, "float32", 4), (2, "int8", 1))]
    table = pa.ipc.open_stream(encode_header(rows)).read_all()
    assert table.column("key").to_pylist() == [1, 2] and table.column("dtype").to_pylist() == ["float32", "int8"]
    sink = pa.BufferOutputStream()  # NOTE: another writer may cut the rows into several batches
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1):
            writer.write_batch(batch)
    assert decode_header(sink.getvalue().to_pybytes()) == rows
    with pytest.raises(WireFormatError, match="does not match shape"):
        decode_header(encode_header([*rows, _header(torch.zeros(2, 3), dtype="int8", nbytes=24)]))


def test_shapes_that_would_overflow_are_rejected():
    wraps = _header(torch.zeros(1), shape=(1 << 32, 1 << 32), nbytes=0)  # product wraps int64 to 0
    with pytest.raises(WireFormatError, match="does not match"):
        decode_header(encode_header([wraps]))
    huge_dim = _header(torch.zeros(1), shape=(1 << 41,), nbytes=(1 << 41) * 4)
    with pytest.raises(WireFormatError, match="out of range"):
        decode_header(encode_header([huge_dim]))


@pytest.mark.parametrize(
    "sizes",
    [[0], [5], [1000, 0, 3333], [4096, 4096], [100] * 20, [100, 0, 600, 100, 100, 5000, 3, 512, 511, 1]],
)
def test_copy_with_digests_copies_and_hashes_each_block_across_chunks(sizes):
    src = torch.randint(0, 255, (sum(sizes),), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    dst = torch.zeros(sum(sizes) + 7, dtype=torch.uint8)
    digests = copy_with_digests(dst.numpy().data, src.numpy().data, sizes, chunk=512)
    assert torch.equal(dst[: sum(sizes)], src) and int(dst[sum(sizes) :].sum()) == 0
    assert digests == [checksum(part) for part in src.split(sizes)]


def test_copy_with_digests_refuses_sizes_that_do_not_cover_the_source():
    src = torch.zeros(10, dtype=torch.uint8)
    with pytest.raises(ValueError, match="do not match"):
        copy_with_digests(torch.zeros(10, dtype=torch.uint8).numpy().data, src.numpy().data, [4, 4])


@pytest.mark.parametrize("padding", [0, 40], ids=["few-rows", "many-rows"])  # NOTE: both decode paths
def test_every_check_holds_for_small_and_big_headers(padding):
    ok = [_header(torch.zeros(2, 3), key=100 + i, token_ids=tuple(range(i % 3))) for i in range(padding)]
    mixed = [*ok, _header(torch.zeros(5), key=8, token_ids=(), shape=(5,), nbytes=20, dtype="float32")]
    assert decode_header(encode_header(mixed)) == mixed
    cases = {
        "refusing to allocate": _header(torch.zeros(1), shape=(1 << 38,), nbytes=(1 << 38) * 4),
        "does not match shape": _header(torch.zeros(4), nbytes=3),
        "does not match": _header(torch.zeros(1), shape=(1 << 32, 1 << 32), nbytes=0),
        "out of range": _header(torch.zeros(1), shape=(1 << 41,), nbytes=(1 << 41) * 4),
        "unsupported dtype": _header(torch.zeros(1), dtype="complex32"),
    }
    for message, bad in cases.items():
        with pytest.raises(WireFormatError, match=message):
            decode_header(encode_header([*ok, bad]))


def test_null_fields_are_a_wire_error():
    import pyarrow as pa

    table = pa.ipc.open_stream(encode_header([_header(torch.zeros(1))])).read_all()
    nulled = table.set_column(7, table.schema.field(7), pa.array([None], pa.uint64()))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, nulled.schema) as writer:
        writer.write_table(nulled)
    with pytest.raises(WireFormatError, match="null"):
        decode_header(sink.getvalue().to_pybytes())
