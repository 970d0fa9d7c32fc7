from __future__ import annotations

import json

from typer.testing import CliRunner

from graphflow.cli import app

runner = CliRunner()


def test_unknown_model_is_one_clear_line():
    result = runner.invoke(app, ["check", "exact", "--model", "nope", "--json"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1
    assert "unknown model 'nope'" in lines[0] and "tiny-llama" in lines[0]


def test_models_list_json_is_last_line():
    result = runner.invoke(app, ["models", "list", "--json"])
    assert result.exit_code == 0
    names = [m["name"] for m in json.loads(result.output.strip().splitlines()[-1])["models"]]
    assert "smollm2-135m" in names


def test_bench_prefill_json():
    result = runner.invoke(
        app, ["bench", "prefill", "--model", "tiny-llama", "--tokens", "32,64", "--repeats", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output.strip().splitlines()[-1])["rows"]
    assert [r["tokens"] for r in rows] == [32, 64]
    assert all(r["kv_bytes_per_token"] == 512 and r["prefill_s_median"] > 0 for r in rows)


def test_bench_manager_life_json():
    result = runner.invoke(app, ["bench", "manager-life", "--nodes", "20,40", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output.strip().splitlines()[-1])["rows"]
    assert [(r["runs_ended"], r["nodes"]) for r in rows] == [(True, 20), (True, 40), (False, 20), (False, 40)]
    assert [r["states_kept"] for r in rows] == [20, 40, 20, 40]  # under ten minutes of runs: all kept
    bad = runner.invoke(app, ["bench", "manager-life", "--nodes", "40,20"])
    assert bad.exit_code == 2 and "increasing positive node counts" in bad.output


def test_bad_token_list():
    result = runner.invoke(app, ["bench", "prefill", "--tokens", "1k", "--json"])
    assert result.exit_code == 2
    assert "comma-separated integers" in result.output


def test_serve_refuses_an_unknown_template_set_before_starting_anything():
    result = runner.invoke(app, ["serve", "--templates", "long", "--json"])
    assert result.exit_code != 0
    assert "unknown template set 'long'; use one of short, detailed" in result.output


def test_generate_compiles_with_the_chosen_templates():
    result = runner.invoke(app, ["generate", "--task", "Add 2 and 3.", "--templates", "detailed", "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.output.strip().splitlines()[-1])
    assert got["templates"] == "detailed" and all(n["template_chars"] > 800 for n in got["nodes"])
    bad = runner.invoke(app, ["generate", "--task", "Add 2 and 3.", "--templates", "long"])
    assert bad.exit_code != 0 and "unknown template set 'long'" in bad.output


def test_bench_submit_prints_each_submit_and_the_medians(monkeypatch, tmp_path):
    import graphflow.bench.submit as bench

    seen: list[list[str]] = []

    def submit(command):  # NOTE: stands in for the submit process (no deployment here)
        seen.append(command)
        return 0, json.dumps({"runs": [{"task": "t", "final": "42"}], "wall_s": 0.0}) + "\n", ""

    monkeypatch.setattr(bench, "_run", submit)
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("Add 2 and 3.\n")
    shown = runner.invoke(app, ["bench", "submit", "--address", "ray://h:10001", "--tasks-file", str(tasks)])
    assert shown.exit_code == 0, shown.output
    assert len(seen) == 6 and seen[0][3:7] == ["submit", "--address", "ray://h:10001", "--tasks-file"]
    said = " ".join(shown.output.split())
    assert "median of 5:" in said and "the same outputs every time" in said
    got = runner.invoke(
        app, ["bench", "submit", "--address", "ray://h:10001", "--task", "x", "--submits", "2", "--json"]
    )
    report = json.loads(got.output.strip().splitlines()[-1])
    assert got.exit_code == 0 and len(report["rows"]) == 3 and report["same_outputs"] is True
    nothing = runner.invoke(app, ["bench", "submit", "--address", "ray://h:10001"])
    assert nothing.exit_code == 2 and "nothing to run" in nothing.output


def test_generate_writes_a_workflow_that_submit_can_run(tmp_path):
    import json

    from graphflow.cli.submit import submitted_workflow

    path = tmp_path / "w.yaml"
    got = runner.invoke(app, ["generate", "--task", "Add 2 and 3, then check.", "--out", str(path), "--json"])
    assert got.exit_code == 0, got.output
    shown = json.loads(got.stdout.strip().splitlines()[-1])
    wf = submitted_workflow(path)
    assert shown["workflow_file"] == str(path) and [n["id"] for n in shown["nodes"]] == [n.id for n in wf.nodes]


def test_every_group_lists_its_commands_in_whole_sentences():
    """A group's ``--help`` lists each command by its docstring's first paragraph on one line
    (Typer's rich help kept the docstring's line breaks there, mid-sentence)."""
    listed = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "200"}).output
    row = next(line for line in listed.splitlines() if "manager-life" in line)
    assert "records kept and snapshot time after each count of nodes served" in row, listed

    def commands(group):
        yield from group.registered_commands
        for sub in group.registered_groups:
            yield from commands(sub.typer_instance)

    assert all(info.short_help and "\n" not in info.short_help for info in commands(app))
