import json

from graphflow.checks.fault_report import FaultReport, ScenarioResult


def test_a_report_passes_only_when_every_scenario_completed_correctly_and_nothing_was_lost():
    good = ScenarioResult("load", True, True, "32 concurrent workflows", seconds=1.5)
    assert FaultReport((good, good)).ok
    assert not FaultReport((good, ScenarioResult("bad-input", True, False, "wrong output"))).ok
    assert not FaultReport((good, ScenarioResult("replica-dies", False, False, "crashed", lost_requests=1))).ok
    lost_but_correct = FaultReport((ScenarioResult("load", True, True, "", lost_requests=2),))
    assert lost_but_correct.passed == 1 and not lost_but_correct.ok


def test_the_json_report_keeps_its_keys():
    report = FaultReport((ScenarioResult("load", True, True, "ok", 0, 1.5), ScenarioResult("x", False, False, "", 1)))
    flat = json.loads(json.dumps(report.to_json()))
    assert (flat["scenarios"], flat["passed"], flat["lost_requests"]) == (2, 1, 1)
    assert flat["rows"][0] == {
        "name": "load",
        "completed": True,
        "outputs_correct": True,
        "detail": "ok",
        "lost_requests": 0,
        "seconds": 1.5,
    }
