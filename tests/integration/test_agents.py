"""The two-replica agents job end to end on a tiny model over UCX: every system produces the
same tokens, ours moves the root instead of recomputing it, and keeps the root once."""

from __future__ import annotations

import pytest

from experiments.agents_job import reduce, run_agents, same_tokens
from experiments.peak_memory.run import memory_rows


@pytest.mark.ucx
def test_agents_job_measures_every_system():
    trials, meta = run_agents("tiny-llama", 200, [(1, 1), (1, 4), (2, 2)], suffix=16, decode=6, repeats=1)
    rows = {(r["roots"], r["agents_per_root"], r["system"]): r for r in reduce(trials)}
    assert len(rows) == 3 * 5 and meta["root_bytes"] > 0
    assert same_tokens(trials, "ours", "local") == 1.0  # the same KV, moved instead of recomputed
    assert same_tokens(trials, "ours", "dense") == 1.0
    for key, row in rows.items():
        assert row["makespan_s"] > 0 and row["generated_tokens"] == key[0] * key[1] * 6
    four = {s: rows[(1, 4, s)] for s in ("dense", "local", "ours")}
    assert four["ours"]["transfer_s"] > 0 and four["ours"]["prefill_s"] == 0
    assert four["local"]["prefill_s"] > 0  # B computed the root itself
    mem = {
        r["system"]: r
        for r in memory_rows([r for r in rows.values() if r["agents"] == 4 and r["roots"] == 1], meta["root_bytes"])
    }
    assert mem["ours"]["roots_held_once"] is True
    assert mem["ours"]["stored_bytes"] < mem["dense"]["stored_bytes"]
