"""The transfer-vs-recompute sweep end to end on a tiny model (two MPI processes)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest


@pytest.mark.mpi
def test_sweep_writes_csv_plot_and_summary(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphflow.cli",
            "sweep",
            "transfer-vs-recompute",
            "--model",
            "tiny-llama",
            "--contexts",
            "256,1024",
            "--backends",
            "mpi",
            "--links",
            "",
            "--repeats",
            "2",
            "--out",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["points"] == 2 and 0 <= summary["decision_accuracy"] <= 1
    with open(tmp_path / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["context"]) for r in rows] == [256, 1024]
    assert all(float(r["measured_recompute_s"]) > 0 and float(r["measured_transfer_s"]) > 0 for r in rows)
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
