"""``graphflow bench submit``: what one ``graphflow submit`` costs, end to end, against a
running deployment.

Each submit is a process of its own, as a user's is: the command starts, imports, connects a
new Ray client, runs its tasks, prints its ``--json`` object and exits. Per submit this records
the wall time from process start to exit, the time its tasks ran (the submit's own
``wall_s``) and the rest (start-up, imports, connecting, exit); submits run one after another,
the first ``warmup`` left out of the medians. The outputs of every submit are compared: a
deployment serves the same tasks the same way each time (greedy decoding).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from graphflow.runtime.errors import Unavailable

__all__ = ["Runner", "SubmitReport", "SubmitRow", "bench_submit", "submit_command"]

# runs a command, returns (exit status, stdout, stderr)
Runner = Callable[[list[str]], tuple[int, str, str]]


@dataclass(frozen=True, slots=True)
class SubmitRow:
    index: int
    warmup: bool
    wall_s: float  # process start to exit
    run_s: float  # the submit's own wall_s: its tasks running
    outside_s: float  # wall_s - run_s: start-up, imports, connecting, exit
    finals: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SubmitReport:
    rows: tuple[SubmitRow, ...]
    median_wall_s: float
    median_run_s: float
    median_outside_s: float
    min_wall_s: float
    max_wall_s: float
    same_outputs: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def submit_command(address: str, task: str, tasks_file: Path | None, decode: int) -> list[str]:
    """The ``graphflow submit`` each measured process runs."""
    what = ["--tasks-file", str(tasks_file)] if tasks_file is not None else ["--task", task]
    return [
        sys.executable,
        "-m",
        "graphflow.cli",
        "submit",
        "--address",
        address,
        *what,
        "--decode",
        str(decode),
        "--json",
    ]


def _run(command: list[str]) -> tuple[int, str, str]:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout, done.stderr


def _parsed(index: int, rc: int, stdout: str, stderr: str) -> tuple[float, tuple[str, ...]]:
    """(the submit's own wall_s, each task's final output) from its ``--json`` line."""
    if rc == 1 and (refused := _refusal(stdout)):  # NOTE: 1: a task of the file refused, its sentence in the JSON
        raise RuntimeError(f"submit {index + 1}: the deployment refused a task: {refused}")
    if rc != 0:
        at = stderr.rfind("error:")  # NOTE: the command's one sentence, which its console may have wrapped
        why = " ".join(stderr[at + len("error:") :].split()) if at >= 0 else " ".join(stderr.split()[-30:])
        failed = f"submit {index + 1} exited {rc}: {why or 'no message'}"
        raise Unavailable(failed) if rc == 2 else RuntimeError(failed)  # NOTE: 2: the command's refusal
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        got = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError) as exc:
        raise RuntimeError(f"submit {index + 1} printed no JSON object as its last line") from exc
    runs = got.get("runs", [got])
    return float(got["wall_s"]), tuple(str(r["final"]) for r in runs)  # NOTE: exit 0: every task ran


def _refusal(stdout: str) -> str:
    """The first refused task's sentence in a submit's ``--json`` line ("" when there is none)."""
    try:
        got = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return ""
    return next((str(r["error"]) for r in got.get("runs", []) if r.get("error")), "") if isinstance(got, dict) else ""


def bench_submit(
    command: Sequence[str],
    submits: int = 5,
    warmup: int = 1,
    run: Runner | None = None,
    clock: Callable[[], float] = time.perf_counter,
    say: Callable[[str], None] = lambda _m: None,
) -> SubmitReport:
    """Run ``command`` (a ``graphflow submit … --json``) ``warmup + submits`` times in a row
    (``run``: how a command runs; a subprocess unless given)."""
    if submits < 1:
        raise ValueError(f"submits must be 1 or more, got {submits}")
    if warmup < 0:
        raise ValueError(f"warmup must be 0 or more, got {warmup}")
    run = run or _run
    rows = []
    for i in range(warmup + submits):
        start = clock()
        rc, stdout, stderr = run(list(command))
        wall = clock() - start
        run_s, finals = _parsed(i, rc, stdout, stderr)
        rows.append(SubmitRow(i, i < warmup, wall, run_s, wall - run_s, finals))
        kind = " (warm-up)" if i < warmup else ""
        say(f"submit {i + 1} of {warmup + submits}{kind}: {wall:.2f} s, tasks {run_s:.2f} s")
    kept = [r for r in rows if not r.warmup]
    walls = [r.wall_s for r in kept]
    return SubmitReport(
        tuple(rows),
        statistics.median(walls),
        statistics.median(r.run_s for r in kept),
        statistics.median(r.outside_s for r in kept),
        min(walls),
        max(walls),
        len({r.finals for r in rows}) == 1,
    )
