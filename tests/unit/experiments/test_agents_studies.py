"""The multi-agent, peak-memory and throughput studies' reductions, on hand-made trials."""

from __future__ import annotations

import json

import pytest

from experiments.agents_job import ideal_s, reduce, same_tokens
from experiments.multi_agent.run import summarize as multi_summary
from experiments.multi_agent.run import table as multi_table
from experiments.peak_memory.run import memory_rows
from experiments.peak_memory.run import summarize as memory_summary
from experiments.throughput.run import summarize as throughput_summary


def _trial(system: str, k: int, makespan: float, rep: int = 0, roots: int = 1, tokens=None, **cols) -> dict:
    row = {
        "system": system,
        "repeat": rep,
        "roots": roots,
        "agents_per_root": k,
        "agents": roots * k,
        "generated_tokens": roots * k * 4,
        "makespan_s": makespan,
        "tokens": json.dumps(tokens if tokens is not None else [[[1, 2, 3, 4]], [[5, 6, 7, 8]]]),
    }
    for side in ("a", "b"):
        for key in (
            "busy_s",
            "prefill_s",
            "transfer_s",
            "rebuild_s",
            "agents_s",
            "stored_bytes",
            "shared_bytes",
            "working_bytes",
            "rss_growth_bytes",
            "rss_peak_bytes",
        ):
            row[f"{side}_{key}"] = cols.get(f"{side}_{key}", 0.0)
    return row


def _workload(k: int, scale: float = 1.0) -> list[dict]:
    return [
        _trial("dense", k, 10.0 * scale, a_stored_bytes=400.0, b_stored_bytes=400.0, a_working_bytes=400.0),
        _trial("text", k, 11.0 * scale),
        _trial("local", k, 6.0 * scale),
        _trial("local_holder", k, 5.0 * scale),
        _trial(
            "ours",
            k,
            4.0 * scale,
            a_rebuild_s=0.1,
            a_agents_s=3.5,
            b_rebuild_s=0.2,
            b_agents_s=3.6,
            b_transfer_s=0.2,
            a_stored_bytes=150.0,
            b_stored_bytes=150.0,
            a_shared_bytes=100.0,
            b_shared_bytes=100.0,
            a_working_bytes=400.0,
        ),
    ]


def test_reduce_takes_medians_over_repeats_and_the_ideal_from_ours():
    trials = [
        _trial("ours", 2, s, rep=i, a_rebuild_s=0.1, a_agents_s=a, b_agents_s=1.0)
        for i, (s, a) in enumerate([(3.0, 2.0), (5.0, 2.2), (4.0, 2.4)])
    ]
    (row,) = reduce(trials)
    assert row["repeats"] == 3 and row["makespan_s"] == 4.0 and row["tokens_per_s"] == 2.0
    assert row["ideal_s"] == pytest.approx(2.3)  # median of max(0.1 + a, 1.0)
    assert ideal_s(trials[0]) == pytest.approx(2.1)


def test_multi_agent_summary_compares_with_the_ideal_and_the_best_baseline():
    trials = _workload(1) + _workload(2, 2.0)
    rows = reduce(trials)
    summary = multi_summary(rows, trials)
    assert summary["multi_agent_efficiency_min"] == pytest.approx(3.8 / 8.0)
    assert summary["best_local_over_ours"] == {2: pytest.approx(10.0 / 8.0)}
    assert summary["ahead_of_text_and_local_every_k_ge_2"] is True
    assert summary["ours_tokens_equal_local"] == 1.0
    text = multi_table(rows, {"model": "m", "threads": 1, "root_prefill_s": {"4096": 9.5}})
    assert "| 2 | 20.00 | 22.00 | 12.00 | 10.00 | 8.00 | 3.80 | 0.475 | 1.25 | 2.75 | 2.50 |" in text


def test_a_slower_ours_is_reported_behind():
    trials = _workload(2)
    trials[3]["makespan_s"] = 3.0  # all-on-holder beats ours
    assert multi_summary(reduce(trials), trials)["ahead_of_text_and_local_every_k_ge_2"] is False


def test_same_tokens_counts_agents_that_match():
    a = [_trial("ours", 2, 1.0, tokens=[[[1, 2]], [[3, 4]]]), _trial("dense", 2, 1.0, tokens=[[[1, 2]], [[3, 9]]])]
    assert same_tokens(a, "ours", "dense") == 0.5  # one agent of two differs


def test_memory_rows_check_roots_held_once_against_the_root_bytes():
    rows = reduce(_workload(4))
    mem = {r["system"]: r for r in memory_rows(rows, root_bytes=100)}
    assert mem["ours"]["stored_over_dense"] == pytest.approx(300 / 800)
    assert mem["ours"]["private_bytes"] == 100 and mem["ours"]["roots_held_once"] is True
    assert mem["dense"]["roots_held_once"] == ""
    assert {r["system"]: r for r in memory_rows(rows, root_bytes=60)}["ours"]["roots_held_once"] is False
    summary = memory_summary([{k: str(v) for k, v in r.items()} for r in memory_rows(rows, 100)])
    assert summary["stored_ratio_vs_dense"] == pytest.approx(0.375) and summary["ours_roots_held_once"]


def test_throughput_summary_is_tokens_per_second_ratios():
    trials = [
        _trial(s, 2, t, roots=4)
        for s, t in (("dense", 8.0), ("text", 8.0), ("local", 4.0), ("local_holder", 5.0), ("ours", 2.0))
    ]
    summary = throughput_summary(reduce(trials))
    assert summary["ours_over_dense"] == {4: 4.0} and summary["ours_over_best_local"] == {4: 2.0}
    assert summary["tokens_per_s_ours"] == {4: 16.0}
