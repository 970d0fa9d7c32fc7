from __future__ import annotations

import numpy as np

from graphflow.kv.catalog import BlockBatch, Catalog
from graphflow.kv.copies import evict_copies, longest_prefix, record_copies


def _batch(replica: str, state: str, keys: list[int], op: str = "") -> BlockBatch:
    n = len(keys)
    return BlockBatch(
        replica=replica,
        state=state,
        key=np.array(keys, dtype=np.uint64),
        parent_key=np.array([0, *keys[:-1]], dtype=np.uint64),
        position_offset=np.arange(n, dtype=np.int32) * 4,
        num_tokens=np.full(n, 4, dtype=np.int16),
        nbytes=np.full(n, 100, dtype=np.int32),
        checksum=np.array(keys, dtype=np.uint64) * np.uint64(3),
        op=op,
    )


def test_compact_drops_only_evicted_rows_nothing_names_and_keeps_answers(tmp_path):
    cat = Catalog()
    record_copies(cat, _batch("r0", "old", [11, 12, 13], op="SOLVE"), 1.0)  # evicted, then forgotten
    record_copies(cat, _batch("r0", "kept", [21, 22]), 2.0)  # evicted, its record kept
    record_copies(cat, _batch("r1", "live", [31, 32, 33]), 3.0)
    record_copies(cat, _batch("r0", "parent", [41]), 4.0)  # evicted, parent of a live block
    record_copies(cat, _batch("r1", "child", [41, 42]), 5.0)
    evict_copies(cat, "r0", [11, 12, 13, 21, 22, 41])
    before = {k: longest_prefix(cat, [k]) for k in (31, 32, 41, 42)}
    assert cat.compact(np.array([21, 22], dtype=np.uint64)) == 3  # 11, 12, 13
    assert sorted(cat.col("key").tolist()) == [21, 22, 31, 32, 33, 41, 41, 42]
    assert {k: longest_prefix(cat, [k]) for k in (31, 32, 41, 42)} == before
    assert cat.rows_of(11) == [] and len(cat) == 5  # the live rows: 31, 32, 33 and r1's 41, 42
    names = sorted(set(cat.names(cat.col("state"))))
    assert names == ["child", "kept", "live", "parent"] and cat.names(cat.col("op")) == [""] * 8
    record_copies(cat, _batch("r0", "later", [51]), 6.0)  # names and the index go on from there
    assert cat.names(cat.col("state")[cat.rows_of(51)]) == ["later"]
    cat.write_parquet(tmp_path / "catalog.parquet")
    back = Catalog.read_parquet(tmp_path / "catalog.parquet")
    assert sorted(back.col("key").tolist()) == sorted(cat.col("key").tolist()) and back.rows_of(51) == cat.rows_of(51)
    assert cat.compact(np.array([21, 22], dtype=np.uint64)) == 0
