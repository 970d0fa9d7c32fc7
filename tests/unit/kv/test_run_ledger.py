"""The manager's runs: who drives each, which ended when, and when their records go."""

import pytest

from graphflow.kv.run_ledger import RunLedger


def test_an_ended_run_is_due_once_its_retention_has_passed_and_only_once():
    runs = RunLedger(retain_ended_s=10.0)
    runs.begin("a", "job-1")
    runs.begin("b", "")  # NOTE: no client: nobody ends it for it
    assert runs.running_owners() == {"job-1"}
    runs.end("a", 5.0)
    assert runs.running_owners() == set() and runs.due(14.9) == []
    assert runs.due(15.0) == ["a"] and runs.due(100.0) == []


def test_the_runs_of_gone_clients_are_named_and_counted_as_abandoned():
    runs = RunLedger()
    for run, owner in (("a", "job-1"), ("b", "job-2"), ("c", "job-1")):
        runs.begin(run, owner)
    assert runs.runs_of(["job-1", "job-9"]) == ["a", "c"] and runs.abandoned == 2
    with pytest.raises(ValueError, match="retain_ended_s must be 0 or more seconds"):
        RunLedger(retain_ended_s=float("nan"))
