import pytest

from graphflow.bench.multi_agent import MultiAgentReport, MultiAgentRow


def _row(system: str, k: int, prefill: float, agents: float) -> MultiAgentRow:
    return MultiAgentRow(system, k, 512, prefill, agents, prefill + agents, 4 * k, 0, {"reuse": k}, 1)


def test_efficiency_is_the_ideal_over_ours_with_and_without_the_roots_prefill():
    rows = [
        _row("ours", 2, 1.0, 3.0),
        _row("ideal", 2, 1.0, 2.0),
        _row("dense", 2, 0.0, 8.0),
        _row("ours", 4, 1.0, 4.0),
    ]
    got = MultiAgentReport(tuple(rows))
    assert got.efficiency == {2: pytest.approx(3.0 / 4.0)}
    assert got.efficiency_agents_only == {2: pytest.approx(2.0 / 3.0)}
    assert got.dense_over_ours == {2: pytest.approx(2.0)}
    assert got.efficiency_min == pytest.approx(0.75)
    flat = got.to_json()
    assert [r["system"] for r in flat["rows"]] == ["ours", "ideal", "dense", "ours"]
    assert flat["efficiency"] == got.efficiency and flat["efficiency_min"] == got.efficiency_min
    assert MultiAgentReport(()).efficiency_min is None
    assert got.prefix_caching_over_ours == {}  # no baseline ran


def test_the_better_prefix_caching_baseline_is_the_faster_of_the_two():
    rows = [_row("ours", 4, 1.0, 3.0), _row("local", 4, 1.0, 11.0), _row("routed", 4, 1.0, 5.0)]
    rows += [_row("holder", 4, 1.0, 7.0), _row("local", 8, 1.0, 1.0)]  # no ours at 8: not judged there
    rows += [_row("ours", 2, 1.0, 1.0), _row("holder", 2, 1.0, 3.0)]  # only one baseline ran at 2
    got = MultiAgentReport(tuple(rows))
    assert got.prefix_caching_over_ours == {2: pytest.approx(2.0), 4: pytest.approx(6.0 / 4.0)}
    assert got.to_json()["prefix_caching_over_ours"] == got.prefix_caching_over_ours


def test_memory_is_judged_against_dense_at_the_same_k_and_survives_a_json_round_trip():
    import dataclasses
    import json

    def grown(row: MultiAgentRow, mib: int) -> MultiAgentRow:
        return dataclasses.replace(row, peak_rss_growth_bytes=mib << 20)

    rows = [grown(_row("ours", 4, 1.0, 3.0), 100), grown(_row("dense", 4, 0.0, 9.0), 400)]
    rows += [grown(_row("holder", 4, 1.0, 3.0), 80), grown(_row("ours", 8, 1.0, 3.0), 150)]  # no dense at 8
    got = MultiAgentReport(tuple(rows), threads=1, transport="ucx")
    assert got.memory_over_dense == {"ours": {4: pytest.approx(0.25)}, "holder": {4: pytest.approx(0.2)}}
    again = MultiAgentReport.from_json(json.loads(json.dumps(got.to_json())))
    assert again == got and again.memory_over_dense == got.memory_over_dense


def test_repeats_keep_the_median_trial_with_every_makespan_and_survive_a_json_round_trip():
    import json

    from graphflow.bench.multi_agent import median_trial

    tries = [_row("ours", 4, 1.0, 5.0), _row("ours", 4, 1.0, 2.0), _row("ours", 4, 2.0, 2.5)]
    kept = median_trial(tries)
    assert kept.agents_s == 2.5 and kept.root_prefill_s == 2.0  # makespans 6.0, 3.0, 4.5: the middle one
    assert kept.makespans_s == (3.0, 4.5, 6.0)
    assert median_trial(tries[:2]).makespan_s == 6.0  # an even count keeps the slower middle trial
    assert median_trial(tries[1:2]).makespans_s == (3.0,)
    with pytest.raises(ValueError, match="no trials"):
        median_trial([])
    report = MultiAgentReport((kept, _row("ideal", 4, 1.0, 2.0)))
    assert MultiAgentReport.from_json(json.loads(json.dumps(report.to_json()))) == report
