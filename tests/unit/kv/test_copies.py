from __future__ import annotations

import numpy as np
import pytest

from graphflow.kv.catalog import BlockBatch, Catalog
from graphflow.kv.copies import evict_copies, locate, longest_prefix, record_copies, rows_on, validate_blocks
from graphflow.kv.keys import ROOT_KEY


def _batch(replica: str, keys: list[int], parents: list[int] | None = None, salt: int = 0) -> BlockBatch:
    n = len(keys)
    return BlockBatch(
        replica=replica,
        state="s",
        key=np.array(keys, dtype=np.uint64),
        parent_key=np.array(parents if parents is not None else [ROOT_KEY, *keys[:-1]], dtype=np.uint64),
        position_offset=np.arange(n, dtype=np.int32) * 4,
        num_tokens=np.full(n, 4, dtype=np.int16),
        nbytes=np.full(n, 100, dtype=np.int32),
        checksum=np.array([k ^ salt for k in keys], dtype=np.uint64),
    )


def test_copies_are_recorded_once_per_replica_and_found_by_prefix():
    cat = Catalog()
    record_copies(cat, _batch("r0", [11, 12, 13]), 0.0)
    record_copies(cat, _batch("r1", [11, 12]), 0.0)
    record_copies(cat, _batch("r0", [11, 12, 13]), 1.0)  # a re-admit adds no row
    assert sorted(locate(cat, 11)) == ["r0", "r1"] and locate(cat, 13) == ["r0"]
    got = [(m.replica, m.num_blocks, m.num_tokens) for m in longest_prefix(cat, [11, 12, 13, 14])]
    assert got == [("r0", 3, 12), ("r1", 2, 8)]
    assert len(rows_on(cat, [11, 12, 13], "r0")) == 3
    with pytest.raises(ValueError, match="does not hold all 3 blocks"):
        rows_on(cat, [11, 12, 13], "r1")


def test_a_copy_reported_under_other_bytes_replaces_the_old_row():
    cat = Catalog()
    record_copies(cat, _batch("r0", [11]), 0.0)
    record_copies(cat, _batch("r0", [11], salt=1), 1.0)
    rows = rows_on(cat, [11], "r0")
    assert len(cat.rows_of(11)) == 1 and int(cat.col("checksum")[rows[0]]) == 11 ^ 1


def test_bad_batches_are_refused_and_pinned_copies_are_not_evicted():
    cat = Catalog()
    twice = _batch("r0", [11, 11], parents=[ROOT_KEY, ROOT_KEY])
    twice.checksum[1] ^= 1
    with pytest.raises(ValueError, match="one block key twice"):
        validate_blocks(cat, twice)
    with pytest.raises(ValueError, match="unknown parents"):
        validate_blocks(cat, _batch("r0", [12], parents=[99]))
    record_copies(cat, _batch("r0", [11, 12]), 0.0)
    cat.add_pins(rows_on(cat, [11], "r0"), 1)
    with pytest.raises(ValueError, match="pinned"):
        evict_copies(cat, "r0", [11, 12])
    assert locate(cat, 12) == ["r0"]  # nothing dropped
    evict_copies(cat, "r0", [12])
    assert locate(cat, 12) == [] and locate(cat, 11) == ["r0"]
