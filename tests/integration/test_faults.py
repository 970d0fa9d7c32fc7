"""`graphflow check faults` on a local Ray cluster: each scenario completes with correct outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from graphflow.checks.fault_report import SCENARIOS

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def report():
    env = {**os.environ, "RAY_AUTH_MODE": "token", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "graphflow.cli", "check", "faults", "--load", "32", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1])


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_completes_with_correct_outputs(report, name):
    row = next(r for r in report["rows"] if r["name"] == name)
    assert row["completed"] and row["outputs_correct"], row["detail"]


def test_nothing_is_lost(report):
    assert report["scenarios"] == len(SCENARIOS) == report["passed"]
    assert report["lost_requests"] == 0
    fallbacks = {r["name"]: r["detail"] for r in report["rows"]}
    dropped, lost = fallbacks["transfer-fails"].split(" | ")
    assert "TransferTimeout" in dropped and "ChecksumMismatch" in fallbacks["corrupt-bytes"]
    assert "TransferAborted" in lost and "TransferTimeout" not in lost  # called off, not waited out
    assert "32 concurrent workflows" in fallbacks["load"]


def test_unknown_scenario_is_refused():
    proc = subprocess.run(
        [sys.executable, "-m", "graphflow.cli", "check", "faults", "--scenario", "meteor"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "unknown scenarios" in proc.stderr
