"""``graphflow bench submit``'s bookkeeping, over a stand-in for the submit process (no Ray)."""

import json
import sys
from pathlib import Path

import pytest

from graphflow.bench.submit import bench_submit, submit_command
from graphflow.runtime.errors import Unavailable


class _Submits:
    """Answers each command with the next of ``outputs`` (rc, stdout), advancing a fake clock
    by ``walls``; records the commands it was given."""

    def __init__(self, outputs, walls):
        self.outputs, self.walls, self.now, self.commands = list(outputs), list(walls), 0.0, []

    def clock(self):
        return self.now

    def run(self, command):
        self.commands.append(command)
        self.now += self.walls.pop(0)
        rc, stdout = self.outputs.pop(0)
        why = "… connecting\nerror: nothing answers at\nray://x:10001; start a deployment\n"
        return rc, stdout, "" if rc == 0 else why if rc == 2 else "Traceback …\nKeyError: 'runs'\n"


def _many(wall_s, *finals):
    return json.dumps({"runs": [{"task": "t", "final": f} for f in finals], "wall_s": wall_s})


def test_medians_leave_the_warm_up_out_and_split_each_submit():
    subs = _Submits(
        [(0, "… progress\n" + _many(4.0, "a", "b"))] + [(0, _many(2.0, "a", "b"))] * 3, [9.0, 5.0, 6.0, 5.5]
    )
    report = bench_submit(["graphflow", "submit"], submits=3, warmup=1, run=subs.run, clock=subs.clock)
    assert [r.warmup for r in report.rows] == [True, False, False, False]
    assert (report.median_wall_s, report.min_wall_s, report.max_wall_s) == (5.5, 5.0, 6.0)
    assert (report.median_run_s, report.median_outside_s) == (2.0, 3.5)
    assert report.rows[0].outside_s == 5.0 and report.rows[0].finals == ("a", "b")
    assert report.same_outputs and subs.commands == [["graphflow", "submit"]] * 4


def test_a_different_output_is_seen_and_a_refused_task_stops_the_bench_with_its_sentence():
    one = json.dumps({"final": "x", "wall_s": 1.0})  # a --task submit prints one run
    subs = _Submits([(0, one), (0, json.dumps({"final": "y", "wall_s": 1.0}))], [2.0, 2.0])
    report = bench_submit(["c"], submits=2, warmup=0, run=subs.run, clock=subs.clock)
    assert not report.same_outputs
    assert [r.finals for r in report.rows] == [("x",), ("y",)]
    refused = json.dumps({"runs": [{"task": "t", "final": "x"}, {"task": "u", "error": "too long"}], "wall_s": 1.0})
    subs = _Submits([(0, _many(1.0, "x", "y")), (1, refused)], [2.0, 2.0])  # NOTE: exit 1: a task of the file refused
    with pytest.raises(RuntimeError, match="^submit 2: the deployment refused a task: too long$"):
        bench_submit(["c"], submits=2, warmup=0, run=subs.run, clock=subs.clock)


def test_a_failed_submit_stops_the_bench_with_its_last_line():
    subs = _Submits([(0, _many(1.0, "a")), (2, "")], [2.0, 1.0])
    with pytest.raises(Unavailable, match="submit 2 exited 2: nothing answers at ray://x:10001; start a deployment$"):
        bench_submit(["c"], submits=2, warmup=0, run=subs.run, clock=subs.clock)
    subs = _Submits([(1, "")], [1.0])
    with pytest.raises(RuntimeError, match="submit 1 exited 1: Traceback … KeyError: 'runs'"):
        bench_submit(["c"], submits=1, warmup=0, run=subs.run, clock=subs.clock)
    subs = _Submits([(0, "no json here\n")], [1.0])
    with pytest.raises(RuntimeError, match="submit 1 printed no JSON object"):
        bench_submit(["c"], submits=1, warmup=0, run=subs.run, clock=subs.clock)


def test_bad_counts_are_refused_before_anything_runs():
    subs = _Submits([], [])
    with pytest.raises(ValueError, match="submits must be 1 or more, got 0"):
        bench_submit(["c"], submits=0, run=subs.run)
    with pytest.raises(ValueError, match="warmup must be 0 or more, got -1"):
        bench_submit(["c"], warmup=-1, run=subs.run)
    assert subs.commands == []


def test_the_command_is_the_users_submit():
    cmd = submit_command("ray://h:10001", "", Path("tasks.txt"), 8)
    assert cmd[:3] == [sys.executable, "-m", "graphflow.cli"]
    assert cmd[3:] == ["submit", "--address", "ray://h:10001", "--tasks-file", "tasks.txt", "--decode", "8", "--json"]
    assert submit_command("ray://h:10001", "Add 2 and 3.", None, 0)[6:9] == ["--task", "Add 2 and 3.", "--decode"]
