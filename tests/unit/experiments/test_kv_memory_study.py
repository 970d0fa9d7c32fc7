from __future__ import annotations

import pytest

from experiments.kv_memory.served import compare
from experiments.kv_memory.summary import bootstrap_ci, choose_operating, comparisons, method_rows, paired


def _row(method, workflow, node, agreement, fraction, family="ours (dense)", **extra):
    base = {"method": method, "family": family, "workflow": workflow, "node": node, "agreement": agreement}
    return {**base, "recompute_fraction": fraction, "kl": 1 - agreement, **extra}


def test_method_rows_average_per_method_and_take_the_median_ttft_ratio():
    rows = [
        _row("a", 0, "n1", 1.0, 0.1, ttft_s=1.0, full_prefill_s=4.0, identical_output=True),
        _row("a", 0, "n2", 0.5, 0.2, ttft_s=3.0, full_prefill_s=4.0, identical_output=False),
        _row("b", 0, "n1", 0.9, 0.0, family="stateless"),
    ]
    a, b = method_rows(rows)
    assert (a["method"], a["executions"], a["agreement"]) == ("a", 2, 0.75)
    assert a["recompute_fraction"] == pytest.approx(0.15)
    assert a["identical_output_rate"] == 0.5 and a["template_ttft_ratio"] == 0.5
    assert b["identical_output_rate"] is None and b["template_ttft_ratio"] is None


def test_the_operating_point_is_the_cheapest_codec_reaching_the_target_else_the_best():
    rows = [_row("x", 0, "n", 0.99, 0.15), _row("y", 0, "n", 0.985, 0.05), _row("z", 0, "n", 0.97, 0.0)]
    assert choose_operating(rows, {"x": 1, "y": 2, "z": 0}) == "y"
    low = [_row("x", 0, "n", 0.9, 0.15), _row("z", 0, "n", 0.95, 0.0)]
    assert choose_operating(low, {"x": 1, "z": 0}) == "z"
    with pytest.raises(ValueError, match="train"):
        choose_operating([_row("s", 0, "n", 1.0, 0.0, family="stateless")], {})


def test_paired_bootstrap_is_deterministic_and_brackets_the_mean():
    diffs = [0.01 * i for i in range(20)]
    lo, hi = bootstrap_ci(diffs)
    assert (lo, hi) == bootstrap_ci(diffs) and lo < sum(diffs) / 20 < hi
    rows = [_row("ours (dense, first 5% recomputed)", 0, f"n{i}", 0.9 + 0.005 * i, 0.05) for i in range(6)]
    rows += [_row("cacheblend-5%", 0, f"n{i}", 0.8, 0.05, family="cacheblend") for i in range(6)]
    c = paired(rows, "ours (dense, first 5% recomputed)", "cacheblend-5%")
    assert c is not None and c["executions"] == 6 and c["ci95"][0] > 0
    found = comparisons(rows, ["ours (dense, first 5% recomputed)", "cacheblend-5%"])
    assert [(x["fraction"], x["other"]) for x in found] == [(0.05, "cacheblend-5%")]


def test_the_served_comparison_pairs_nodes_of_the_same_test_workflow():
    def run(final, out, ttft, decision):
        return {"final": final, "nodes": {"n1": {"output": out, "decision": decision, "first_token_s": ttft}}}

    exact = [run("42", "a", 2.0, "recompute"), run("7", "b", 2.0, "recompute"), {"replica_templates": {}}]
    diff = [run("42", "a", 0.5, "reconstruct"), run("8", "c", 1.0, "recompute"), {"replica_templates": {"n": 1}}]
    s = compare(exact, diff)
    assert (s["test_workflows"], s["test_nodes"], s["rebuilt_nodes"]) == (2, 2, 1)
    assert s["identical_final_rate"] == 0.5 and s["identical_output_rate_rebuilt"] == 1.0
    assert s["ttft_ratio_rebuilt_median"] == 0.25 and s["ttft_ratio_all_median"] == 0.375
