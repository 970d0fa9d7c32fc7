from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from graphflow.kv.block import make_block, make_blocks
from graphflow.kv.errors import ChecksumMismatch
from graphflow.kv.keys import ROOT_KEY, block_key, chain_keys
from transport.layout import MESSAGE_BYTES, message_runs

from .helpers import IDENTITY, kv


def test_chain_keys_follow_the_hash_chain():
    ids = list(range(40))
    keys = chain_keys(ids, "m@h", 16)
    assert len(keys) == 3
    assert keys[0] == block_key(ROOT_KEY, ids[:16], "m@h")
    assert keys[1] == block_key(keys[0], ids[16:32], "m@h")
    assert keys[2] == block_key(keys[1], ids[32:], "m@h")


def test_keys_depend_on_prefix_model_and_tokens():
    base = block_key(ROOT_KEY, [1, 2, 3], "m@h")
    assert block_key(ROOT_KEY, [1, 2, 4], "m@h") != base
    assert block_key(ROOT_KEY, [1, 2, 3], "m@other") != base
    assert block_key(base, [1, 2, 3], "m@h") != base


def test_block_keys_identical_across_processes():
    code = "from graphflow.kv.keys import chain_keys; print(chain_keys(list(range(100)), 'tiny@abc', 16))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(chain_keys(list(range(100)), "tiny@abc", 16))


def test_make_block_copies_into_block_memory_and_verifies():
    big = kv(32)
    block = make_block(ROOT_KEY, list(range(16)), 0, big[:, :, :, :16], IDENTITY.model_key)
    assert block.tensor.is_contiguous()
    assert block.nbytes == 2 * 2 * 2 * 16 * 4 * 4
    assert block.tensor.untyped_storage().data_ptr() != big.untyped_storage().data_ptr()  # a copy, not a view
    assert torch.equal(block.tensor, big[:, :, :, :16])
    block.verify()
    block.tensor.view(-1)[7] += 1.0
    with pytest.raises(ChecksumMismatch):
        block.verify()


def test_make_block_rejects_wrong_shapes():
    with pytest.raises(ValueError, match="token ids"):
        make_block(ROOT_KEY, [1, 2], 0, kv(3), "m")
    with pytest.raises(ValueError, match="layers, 2"):
        make_block(ROOT_KEY, [1, 2], 0, torch.zeros(2, 3, 2, 2, 4), "m")


def test_make_blocks_chains_and_lays_blocks_back_to_back_per_message():
    # 16-token blocks of 2 KiB each here: MESSAGE_BYTES / 2 KiB of them fill one message span
    per_message = MESSAGE_BYTES // 2048
    full = kv(16 * (per_message + 2) + 5)
    ids = list(range(full.shape[3]))
    blocks = make_blocks(ROOT_KEY, ids, 0, full, IDENTITY.model_key, 16)
    assert [b.key for b in blocks] == chain_keys(ids, IDENTITY.model_key, 16)
    assert blocks[-1].num_tokens == 5
    assert all(
        torch.equal(b.tensor, full[:, :, :, b.position_offset : b.position_offset + b.num_tokens]) for b in blocks
    )
    sizes = [b.nbytes for b in blocks]
    for run in message_runs(sizes):
        ptrs = [blocks[i].tensor.data_ptr() for i in run]
        assert all(ptrs[k + 1] == ptrs[k] + sizes[run[k]] for k in range(len(ptrs) - 1))
    assert sizes[0] == 2048 and [len(r) for r in message_runs(sizes)] == [per_message, 3]


def test_make_blocks_rejects_bad_block_tokens():
    with pytest.raises(ValueError, match="block_tokens"):
        make_blocks(ROOT_KEY, [1, 2], 0, kv(2), "m", 0)
