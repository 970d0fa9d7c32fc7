"""``graphflow bench serve`` end to end on a tiny model: both modes on embedded Ray."""

from __future__ import annotations

import pytest

from tests.integration.helpers.cli import cli, last_json

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_bench_serve_batches_concurrent_workflows_and_shares_a_root():
    got = last_json(
        cli(
            "bench",
            "serve",
            "--model",
            "tiny-llama",
            "--workflows",
            "1,4",
            "--root-tokens",
            "128",
            "--decode",
            "6",
            "--memory-agents",
            "4",
            "--memory-root",
            "512",
            "--hol-prefill",
            "0",
            "--baselines",
            "dense,local,routed,holder",
            "--json",
            timeout=900,
        )
    )
    rows = {(r["batching"], r["workflows"]): r for r in got["rows"] if r["system"] == "ours"}
    assert set(rows) == {(True, 1), (True, 4), (False, 1), (False, 4)}
    # the baselines ran the batched workload only, at every count; prefix caching moved nothing
    base = {(r["system"], r["workflows"]): r for r in got["rows"] if r["system"] != "ours"}
    assert set(base) == {(s, w) for s in ("dense", "local", "routed", "holder") for w in (1, 4)}
    assert all(r["batching"] for r in base.values())
    assert set(base["dense", 4]["decisions"]) == {"recompute"} and "transfer" not in base["local", 4]["decisions"]
    assert set(got["ours_over"]) == {"dense", "local", "routed", "holder"}
    assert set(got["ours_over_prefix_caching"]) == {"1", "4"}
    for r in got["rows"]:
        assert r["agents"] == 2 * r["workflows"] and r["generated_tokens"] == 6 * r["agents"]
        assert r["tokens_per_s"] > 0 and 0 < r["ttft_p50_s"] <= r["ttft_p99_s"]
        assert r["peak_rss_bytes"] > 0  # measured, in a trial of its own after the timed ones
        assert r["replica_cpu_s"] > 0 and r["host_cpu_s"] > 0 and r["replica_cores"] > 0
    assert got["row_memory"] is True
    # the engine loop ran the batched rows, and several nodes shared its steps; none ran without it
    assert rows[True, 4]["engine_steps"] > 0 and rows[True, 4]["rows_per_step"] > 1.0
    assert rows[False, 4]["engine_steps"] == 0
    assert set(got["speedup_vs_unbatched"]) == {"1", "4"}
    memory = {(m["batching"], m["reuse"]): m for m in got["memory"]}
    assert set(memory) == {(True, True), (True, False), (False, True), (False, False)}
    assert "batching" in got["memory_growth_vs_dense"]
