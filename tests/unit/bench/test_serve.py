from __future__ import annotations

from dataclasses import replace

import pytest

from graphflow.bench.serve import agents_graph
from graphflow.bench.serve_report import (
    HolRow,
    MemoryRow,
    ServeReport,
    ServeRow,
    calibration_line,
    calibration_summary,
    percentile,
)
from graphflow.workflow.compile import ROOT
from scheduler.cost import DecodeModel, LinkMatrix, LinkSpec, PrefillModel
from scheduler.policy import Policy


def test_agents_graph_fans_out_from_the_task_context():
    g = agents_graph(3)
    assert [n.id for n in g.nodes] == ["agent-0", "agent-1", "agent-2"]
    assert all(n.state_parent == ROOT and not n.preds for n in g.nodes)
    assert len({n.template for n in g.nodes}) == 3  # each agent has a prompt of its own
    assert g.ready(set()) == ["agent-0", "agent-1", "agent-2"]


def test_percentile_interpolates():
    assert percentile([], 0.99) == 0.0
    assert percentile([3.0], 0.5) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.99) == pytest.approx(3.97)


def row(batching: bool, workflows: int, tps: float) -> ServeRow:
    return ServeRow(batching, workflows, 2 * workflows, int(tps * 10), 10.0, tps, 0.1, 0.2, 1, 2, {"reuse": 1}, 5, 2.0)


def test_the_engine_share_is_the_loops_forward_time_over_every_replicas_wall():
    busy = replace(row(True, 16, 90.0), engine_busy_s=15.0, replicas=2)  # 10 s wall
    assert busy.engine_share == pytest.approx(0.75)
    assert ServeReport((busy,)).to_json()["rows"][0]["engine_share"] == pytest.approx(0.75)
    assert row(False, 16, 30.0).engine_share == 0.0  # no loop, no forwards counted


def test_summary_ratios_come_from_the_same_run():
    rows = [row(True, 1, 20.0), row(True, 16, 90.0), row(False, 1, 10.0), row(False, 16, 30.0)]
    memory = [MemoryRow(True, True, 16, 4096, 100, 1.0), MemoryRow(True, False, 16, 4096, 1000, 9.0)]
    hol = [HolRow(True, 4096, (0.5, 0.5), (0.6, 1.0))]
    report = ServeReport(tuple(rows), tuple(memory), tuple(hol), (40, 41))
    assert report.speedup_vs_unbatched == {1: 2.0, 16: 3.0}
    assert report.memory_growth_vs_dense == {"batching": 0.1}
    assert report.head_of_line[0].ratio_p99 == pytest.approx(percentile([0.6, 1.0], 0.99) / 0.5)
    assert report.batched(16) is rows[1] and report.batched(4) is None
    out = report.to_json()
    assert out["speedup_vs_unbatched"] == report.speedup_vs_unbatched and "scripted_tokens_per_s" not in out
    assert out["head_of_line"][0]["ratio_p99"] == report.head_of_line[0].ratio_p99
    assert [r["tokens_per_s"] for r in out["rows"]] == [20.0, 90.0, 10.0, 30.0]
    assert out["agent_prompt_tokens"] == [40, 41]
    assert out["ours_over"] == {} and out["ours_over_prefix_caching"] == {}
    assert out["row_memory"] is True
    assert ServeReport(tuple(rows), row_memory=False).to_json()["row_memory"] is False


def test_ours_is_compared_with_each_baseline_on_the_batched_rows():
    def as_(system: str, workflows: int, tps: float) -> ServeRow:
        return replace(row(True, workflows, tps), system=system)

    rows = [row(True, 16, 90.0), row(False, 16, 30.0), as_("dense", 16, 15.0)]
    rows += [as_("local", 16, 45.0), as_("routed", 16, 60.0), as_("holder", 16, 50.0)]
    report = ServeReport(tuple(rows))
    assert report.speedup_vs_unbatched == {16: 3.0}  # ours batched over ours unbatched, not a baseline
    assert report.ours_over("dense") == {16: 6.0}
    assert report.ours_over_prefix_caching == {16: pytest.approx(1.5)}  # the better of local and routed


def test_cores_are_cpu_seconds_over_the_trial():
    r = replace(row(True, 4, 40.0), replica_cpu_s=15.0, host_cpu_s=19.0)  # a 10 s trial
    assert r.replica_cores == 1.5 and r.other_cores == pytest.approx(0.4)
    out = ServeReport((r,)).to_json()["rows"][0]
    assert out["replica_cores"] == 1.5 and out["other_cores"] == pytest.approx(0.4)
    assert replace(r, host_cpu_s=14.0).other_cores == 0.0  # windows read a moment apart: never negative


def test_bad_sizes_are_refused_before_any_replica_starts():
    """Each is refused by the checks at the top (no Ray here: a check that let one through would
    go on to start a deployment and fail differently)."""
    from graphflow.bench.serve import run_serve_bench

    said: list[str] = []
    good = dict(model="tiny-llama", replicas=2, workflows=[1], root_tokens=8, agents=2, decode=1, modes=[True])
    for bad, match in (
        ({"replicas": 0}, "need at least one replica, got 0"),
        ({"workflows": [0]}, "must all be at least 1"),
        ({"baselines": ["ours"]}, "unknown baseline 'ours'"),
    ):
        with pytest.raises(ValueError, match=match):
            run_serve_bench(**{**good, **bad}, say=said.append)  # type: ignore[arg-type]
    assert said == []


def test_the_report_carries_what_each_deployments_placements_weighed():
    decode = DecodeModel((1, 16), (96, 1536), ((0.03, 0.07), (0.035, 0.09)), contention=1.04)
    policy = Policy(PrefillModel(0.0, 0.01, 0.0), decode=decode)
    links = LinkMatrix({("graphflow-replica-0", "graphflow-replica-1"): LinkSpec("ucx", 5e9, 1e-3)})
    on = calibration_summary(True, policy, links)
    off = calibration_summary(False, replace(policy, decode=None), links)
    report = ServeReport((), calibrations=(on, off)).to_json()
    assert report["calibrations"][0]["decode_steps"]["contention"] == 1.04
    assert report["calibrations"][1]["decode_steps"] is None
    assert report["calibrations"][0]["links"][0]["bandwidth_bytes_per_s"] == 5e9
    assert calibration_line(on) == (
        "Placement weighed, batching on: replicas stepping at once ×1.04; links 0→1 5.0 GB/s "
        "(measured at the deployment's start)."
    )
    assert "batching off: no decode term" in calibration_line(off)
