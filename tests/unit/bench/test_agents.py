"""The agents job's pure parts: who runs which agent, and how a trial becomes a row."""

from __future__ import annotations

import json

from graphflow.bench.agents import AgentsPlan, _row, _Workload


def test_round_robin_splits_each_roots_agents_over_both_replicas(tiny_engine):
    work = _Workload(tiny_engine, AgentsPlan("tiny-llama", 100, [(3, 4)], suffix_tokens=12), roots=3, per_root=4)
    assert len(work.roots) == 3 and {len(r) for r in work.roots} == {100}
    assert len({tuple(r) for r in work.roots}) == 3  # distinct roots
    assert work.held == 96 and {len(s) for _, s in work.branches} == {12}
    a, b = work.mine("ours", 0), work.mine("ours", 1)
    assert sorted(a + b) == list(range(12)) and len(a) == len(b) == 6
    assert work.roots_of(a) == work.roots_of(b) == [0, 1, 2]
    assert work.mine("local_holder", 0) == list(range(12)) and work.mine("local_holder", 1) == []
    single = _Workload(tiny_engine, AgentsPlan("tiny-llama", 64, [(1, 1)]), roots=1, per_root=1)
    assert single.mine("dense", 0) == [0] and single.mine("dense", 1) == []


def _report(agents: int, start: float, end: float, **parts: float) -> dict:
    return {
        "agents": agents,
        "start": start,
        "end": end,
        "parts": parts,
        "tokens": [[1, 2, 3]] * agents,
        "stored_bytes": 100 * agents,
        "shared_bytes": 40,
        "working_bytes": 70,
        "rss_start": 10,
        "rss_peak": 5,
    }


def test_a_row_takes_as_start_and_the_later_end():
    plan = AgentsPlan("m", 4096, [(1, 4)], decode_tokens=3)
    row = _row("ours", 0, 1, 4, plan, _report(2, 10.0, 12.0, agents_s=1.5), _report(2, 10.001, 12.5, transfer_s=0.2))
    assert row["makespan_s"] == 2.5 and row["generated_tokens"] == 12
    assert row["a_transfer_s"] == 0.0 and row["b_transfer_s"] == 0.2 and row["a_agents_s"] == 1.5
    assert row["b_busy_s"] == 12.5 - 10.001 and row["a_rss_growth_bytes"] == 0  # a peak below the start is 0
    assert json.loads(row["tokens"]) == [[[1, 2, 3]] * 2] * 2
