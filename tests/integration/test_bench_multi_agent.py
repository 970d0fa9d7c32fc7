"""``graphflow bench multi-agent`` end to end on a tiny model (embedded Ray, two replicas)."""

from __future__ import annotations

import pytest

from tests.integration.helpers.cli import cli, last_json

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _bench(agents: str, root_tokens: int, decode: int, *more: str, timeout: int) -> dict:
    """``graphflow bench multi-agent`` on the tiny model; its JSON."""
    args = ("--agents", agents, "--root-tokens", str(root_tokens), "--decode", str(decode), *more, "--json")
    return last_json(cli("bench", "multi-agent", "--model", "tiny-llama", *args, timeout=timeout))


def test_ours_ideal_dense_and_prefix_caching_run_through_the_served_path():
    got = _bench("1,3", 1024, 4, timeout=900)
    rows = {(r["agents"], r["system"]): r for r in got["rows"]}
    systems = ("ours", "ideal", "dense", "local", "routed", "holder")
    assert set(rows) == {(k, s) for k in (1, 3) for s in systems}
    for (k, system), r in rows.items():
        assert r["generated_tokens"] == 4 * k and r["makespan_s"] > 0
        assert (r["root_prefill_s"] > 0) == (system != "dense")
    for k in (1, 3):
        assert rows[k, "ideal"]["bytes_moved"] == 0  # the ideal moves nothing by construction
        assert "reuse" in rows[k, "ideal"]["decisions"] and "recompute" in rows[k, "dense"]["decisions"]
        assert all(
            rows[k, s]["bytes_moved"] == 0 for s in ("local", "routed", "holder")
        )  # prefix caching moves nothing
        assert rows[k, "holder"]["replicas_used"] == 1
        assert "transfer" not in rows[k, "local"]["decisions"] and "transfer" not in rows[k, "routed"]["decisions"]
    # round robin over two replicas: the second replica's agent holds no prefix and recomputes it
    assert rows[3, "local"]["replicas_used"] == 2 and rows[3, "local"]["decisions"].get("recompute", 0) >= 1
    assert set(got["efficiency"]) == {"1", "3"} and all(e > 0 for e in got["efficiency"].values())
    assert set(got["prefix_caching_over_ours"]) == {"1", "3"}
    assert got["transport"] == "ucx"
    assert all(r["peak_rss_growth_bytes"] > 0 for r in got["rows"])  # each trial's memory measured by default


def test_no_memory_times_the_trials_without_measuring_memory():
    got = _bench("2", 512, 2, "--systems", "ours", "--no-memory", timeout=600)
    (row,) = got["rows"]
    assert row["system"] == "ours" and row["generated_tokens"] == 4 and row["makespan_s"] > 0
    assert row["peak_rss_growth_bytes"] == 0 and got["memory_over_dense"] == {}
