"""``graphflow submit`` and ``status``: what is checked before connecting, and the status tables."""

import pytest


def test_status_tables_show_every_name_and_figure_whole_in_80_columns():
    import io
    from dataclasses import fields, replace

    from rich.console import Console

    from graphflow.cli.submit import status_tables
    from graphflow.runtime.stats import ReplicaStats, Route

    zero = {f.name: 0 for f in fields(ReplicaStats) if f.type in ("int", int)}
    text = {f.name: "" for f in fields(ReplicaStats) if f.type in ("str", str)}
    base = ReplicaStats(**zero, **text, batching=True)
    stats = [
        replace(
            base,
            replica=f"graphflow-replica-{i}",
            model="qwen2-0.5b-shape",
            host="10.233.0.12",
            device="cpu",
            threads=8,
            used_bytes=123 << 20,
            peak_bytes=456 << 20,
            capacity_bytes=16384 << 20,
            pool_bytes=15000 << 20,
            prefaulted_bytes=16384 << 20,
            routes=(Route(f"graphflow-replica-{1 - i}", ("sysv/memory", "cma/memory")),),
        )
        for i in range(2)
    ]
    console = Console(width=80, record=True, file=io.StringIO())
    for table in status_tables(stats):
        console.print(table)
    shown = console.export_text()
    assert "…" not in shown and max(len(line) for line in shown.splitlines()) <= 80, shown
    for whole in ("graphflow-replica-0", "graphflow-replica-1", "qwen2-0.5b-shape", "10.233.0.12", "cpu ×8"):
        assert whole in shown, whole
    for figure in ("123.0", "(456.0)", "15000", "16384", "shared memory"):
        assert figure in shown, figure
    assert [t.title for t in status_tables(stats)] == ["replicas", "KV", "routes (peers each replica has sent to)"]
    assert [t.title for t in status_tables([replace(s, routes=()) for s in stats])] == ["replicas", "KV"]
    # replica 1 died: replica 0's route to it names its UCX worker address (hundreds of hex digits)
    survivor = replace(stats[0], routes=(Route("208a05aa7e72d8c7af" + "0" * 600, ("sysv/memory",)),))
    console = Console(width=80, record=True, file=io.StringIO())
    for table in status_tables([survivor]):
        console.print(table)
    shown = console.export_text()
    assert "no replica now (address starts 208a05aa7e72)" in shown, shown
    assert max(len(line) for line in shown.splitlines()) <= 80, shown


def test_status_says_when_fewer_replicas_run_than_serve_started_and_what_to_do():
    from graphflow.cli.submit import replicas_missing_line

    said = replicas_missing_line(1, 2)
    assert said.startswith("1 of the 2 replicas serve started is running") and "`graphflow serve`" in said
    assert replicas_missing_line(2, 4).startswith("2 of the 4 replicas serve started are running")


def test_an_empty_task_is_refused_before_connecting():
    from typer.testing import CliRunner

    from graphflow.cli import app

    # NOTE: nothing answers at this address; a connect would fail with another message
    result = CliRunner().invoke(app, ["submit", "--address", "ray://127.0.0.1:9", "--task", "  "])
    assert result.exit_code == 2 and "the task is empty; pass the task's text" in result.output, result.output
    assert "connecting" not in result.output
    negative = CliRunner().invoke(app, ["submit", "--address", "ray://127.0.0.1:9", "--task", "x", "--decode", "-3"])
    assert negative.exit_code == 2 and "must be 0 or more, got -3" in negative.output, negative.output
    assert "connecting" not in negative.output


def test_a_tasks_file_is_checked_before_connecting(tmp_path):
    from typer.testing import CliRunner

    from graphflow.cli import app

    def submit(*args: str) -> tuple[int, str]:
        # NOTE: nothing answers at this address; a connect would fail with another message
        got = CliRunner().invoke(app, ["submit", "--address", "ray://127.0.0.1:9", *args])
        return got.exit_code, " ".join(got.output.split())

    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("Add 2 and 3.\n")
    assert submit("--tasks-file", str(blank)) == (
        2,
        f"error: --tasks-file {blank} has no tasks; write one task per line",
    )
    code, said = submit("--tasks-file", str(tmp_path / "missing.txt"))
    assert code == 2 and "cannot read --tasks-file" in said and "No such file" in said
    assert submit("--tasks-file", str(tasks), "--task", "x") == (2, "error: give --task or --tasks-file, not both")
    for given in (("--tasks-file", str(tasks)), ("--task", "Add 2 and 3.")):
        assert submit(*given, "--concurrency", "0") == (2, "error: --concurrency must be 1 or more, got 0")
    assert submit("--tasks-file", str(tasks), "--timeout", "-1") == (
        2,
        "error: --timeout must be 0 (no limit) or more, got -1",
    )


def test_a_tasks_file_takes_benchmark_lines_by_their_task_text(tmp_path):
    """A line of ``shared/data/tasks`` (a JSON object) is its question / problem / prompt /
    context; a plain line is the task's text, a brace at its start included."""
    from graphflow.cli.submit import submitted_tasks

    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"question": " Add 2 and 3. ", "answer": "5"}\nPlain text.\n{not json} is a task too\n')
    assert submitted_tasks("", mixed, 4) == ["Add 2 and 3.", "Plain text.", "{not json} is a task too"]
    bare = tmp_path / "bare.jsonl"
    bare.write_text('Plain.\n{"answer": "5"}\n')
    with pytest.raises(
        ValueError, match="line 2 of --tasks-file .* is a JSON object with no task text; give it one of"
    ):
        submitted_tasks("", bare, 4)


def test_submit_without_a_task_says_what_to_give():
    from typer.testing import CliRunner

    from graphflow.cli import app

    got = CliRunner().invoke(app, ["submit", "--address", "ray://127.0.0.1:9"])
    assert got.exit_code == 2 and "nothing to run; give --task TEXT or --tasks-file FILE" in got.output, got.output


def test_the_manager_line_says_what_it_holds_and_how_its_runs_stand():
    from dataclasses import fields

    from graphflow.cli.submit import manager_line
    from graphflow.kv.events import ManagerStats
    from graphflow.runtime.stats import ReplicaStats

    zero = {f.name: 0 for f in fields(ReplicaStats) if f.type in ("int", int)}
    text = {f.name: "" for f in fields(ReplicaStats) if f.type in ("str", str)}
    stats = [ReplicaStats(**{**zero, "blocks": 1_330}, **text, batching=True) for _ in range(2)]
    line = manager_line(ManagerStats(600, 11_400, 2_660, 3, 120, 2, 0.0125), stats)
    assert line == (
        "manager: 600 state records, 11400 catalog rows (2660 live; the replicas hold 2660); runs 3 running, "
        "120 ended, 2 abandoned; last snapshot 0.013 s"
    )
    late = [stats[0], ReplicaStats(**{**zero, "blocks": 1_300, "evictions_waiting": 2}, **text, batching=True)]
    assert "(2660 live; the replicas hold 2630, 2 evictions not yet reported)" in manager_line(
        ManagerStats(600, 11_400, 2_660), late
    )
    assert manager_line(ManagerStats(), []).endswith("; no snapshot yet")


def test_a_tasks_file_with_a_refused_task_prints_every_outcome_and_exits_1(tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    import graphflow.client
    from graphflow.cli import app
    from graphflow.client import TaskOutcome

    class Cluster:
        replicas = ["r0", "r1"]

    class Client:
        cluster = Cluster()

        def served_model(self, wanted: str = "") -> str:
            return "tiny-llama"

        def run_many(self, tasks, concurrency, reuse=True, on_task=None, **_):
            outcomes = [
                TaskOutcome(i, t, None, error=f"refused {t}", seconds=0.1, timed_out=t == "two")
                for i, t in enumerate(tasks)
            ]
            for o in outcomes:
                on_task(o)
            return outcomes

    monkeypatch.setattr(graphflow.client, "connect", lambda *_a, **_k: Client())
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("one\ntwo\n")
    got = CliRunner().invoke(app, ["submit", "--address", "ray://h:10001", "--tasks-file", str(tasks), "--json"])
    assert got.exit_code == 1, got.output
    shown = json.loads(got.stdout.strip().splitlines()[-1])
    assert [(r["error"], r["timed_out"]) for r in shown["runs"]] == [("refused one", False), ("refused two", True)]
    assert "refused: refused one" in got.stderr and "out of time: refused two" in got.stderr
    assert "1 of 2 tasks refused; 1 of 2 tasks out of time" in got.stderr


def test_a_workflow_file_is_checked_before_connecting(tmp_path):
    from typer.testing import CliRunner

    from graphflow.cli import app

    def submit(*args: str) -> tuple[int, str]:
        # NOTE: nothing answers at this address; a connect would fail with another message
        got = CliRunner().invoke(app, ["submit", "--address", "ray://127.0.0.1:9", "--task", "Add 2 and 3.", *args])
        return got.exit_code, " ".join(got.output.split())

    two = tmp_path / "two.yaml"
    two.write_text("- nodes: [{id: a, operator: Custom}]\n- nodes: [{id: b, operator: Format}]\n")
    said = f"error: --workflow {two} holds 2 workflows; give a file of exactly one"
    assert submit("--workflow", str(two)) == (2, said)
    code, said = submit("--workflow", str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read --workflow" in said and "No such file" in said and "connecting" not in said
    odd = tmp_path / "odd.yaml"
    odd.write_text("- nodes: [{id: a, operator: Teleport}]\n")
    assert submit("--workflow", str(odd))[1].startswith("error: unknown operation 'Teleport'")


def test_submit_runs_every_task_of_a_file_through_the_given_workflow(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import graphflow.client
    from graphflow.cli import app
    from graphflow.client import TaskOutcome

    given = []

    class Cluster:
        replicas = ["r0"]

    class Client:
        cluster, templates = Cluster(), "short"

        def served_model(self, wanted: str = "") -> str:
            return "tiny-llama"

        def run_many(self, tasks, concurrency, reuse=True, on_task=None, workflow=None, timeout_s=None):
            given.append((workflow, timeout_s))
            return [TaskOutcome(i, t, None, error="stop here") for i, t in enumerate(tasks)]

    monkeypatch.setattr(graphflow.client, "connect", lambda *_a, **_k: Client())
    (tmp_path / "tasks.txt").write_text("one\n")
    (tmp_path / "w.yaml").write_text("- name: mine\n  nodes: [{id: a, operator: Custom, role: SOLVE}]\n")
    args = ["submit", "--address", "ray://h:10001", "--tasks-file", str(tmp_path / "tasks.txt")]
    assert CliRunner().invoke(app, [*args, "--workflow", str(tmp_path / "w.yaml"), "--timeout", "30"]).exit_code == 1
    assert [(w.name, t) for w, t in given] == [("mine", 30.0)] and [n.id for n in given[0][0].nodes] == ["a"]
    assert CliRunner().invoke(app, args).exit_code == 1 and given[1] == (None, None)  # 0: no limit
