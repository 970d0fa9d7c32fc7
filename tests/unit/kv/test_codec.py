from __future__ import annotations

import pytest
import torch

from graphflow.kv.block import make_block
from graphflow.kv.codec import load_blocks, save_blocks
from graphflow.kv.errors import ChecksumMismatch
from graphflow.kv.keys import ROOT_KEY
from transport.wire import WireFormatError, WireLimits

from .helpers import IDENTITY, kv


def _blocks():
    a = make_block(ROOT_KEY, range(16), 0, kv(16, 1), IDENTITY.model_key)
    b = make_block(a.key, range(16, 20), 16, kv(4, 2), IDENTITY.model_key)
    return [a, b]


def test_save_load_round_trip(tmp_path):
    blocks = _blocks()
    n = save_blocks(tmp_path / "f", blocks)
    assert n == (tmp_path / "f").stat().st_size
    loaded = load_blocks(tmp_path / "f")
    assert [(b.key, b.parent_key, b.token_ids, b.position_offset, b.checksum) for b in loaded] == [
        (b.key, b.parent_key, b.token_ids, b.position_offset, b.checksum) for b in blocks
    ]
    for x, y in zip(loaded, blocks, strict=True):
        assert torch.equal(x.tensor, y.tensor)


def test_flipped_byte_in_file_raises_checksum_mismatch(tmp_path):
    save_blocks(tmp_path / "f", _blocks())
    data = bytearray((tmp_path / "f").read_bytes())
    data[-5] ^= 0x01
    (tmp_path / "f").write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        load_blocks(tmp_path / "f")


def test_limits_are_enforced_before_allocating(tmp_path):
    save_blocks(tmp_path / "f", _blocks())
    with pytest.raises(WireFormatError, match="limit"):
        load_blocks(tmp_path / "f", WireLimits(max_total_bytes=1000))
    with pytest.raises(WireFormatError, match="blocks"):
        load_blocks(tmp_path / "f", WireLimits(max_blocks=1))
