"""Studies refuse to write committed results from a dirty tree unless told, and say so when told."""

from __future__ import annotations

import json

import pytest

from experiments import common


@pytest.fixture
def dirty(monkeypatch):
    monkeypatch.setitem(common.STARTED_AT, "git_dirty", True)
    monkeypatch.setitem(common.STARTED_AT, "git_sha", "0123456789abcdef")
    monkeypatch.setitem(common.STARTED_AT, "git_diff_sha256", "feedface" * 8)
    monkeypatch.setitem(common._RUN, "dirty_allowed", False)


def test_a_dirty_tree_stops_a_full_run_but_not_a_quick_one(dirty):
    with pytest.raises(SystemExit, match="--allow-dirty"):
        common.guard_tree(allow_dirty=False)
    common.guard_tree(allow_dirty=False, quick=True)
    assert common._RUN["dirty_allowed"] is False


def test_allowed_dirt_is_recorded_in_meta_and_under_every_table(dirty, tmp_path):
    common.guard_tree(allow_dirty=True)
    common.write_meta(tmp_path, study="x")
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["git_dirty"] is True and meta["allow_dirty"] is True and meta["study"] == "x"
    readme = tmp_path / "README.md"
    readme.write_text("top\n<!-- BEGIN table -->\nold\n<!-- END table -->\nbottom\n")
    common.replace_section(readme, "table", "| a |")
    text = readme.read_text()
    assert "old" not in text and "| a |" in text and "bottom" in text
    assert "--allow-dirty" in text and "0123456789" in text and "feedfacefeed" in text


def test_a_clean_run_writes_tables_without_a_mark(monkeypatch, tmp_path):
    monkeypatch.setitem(common.STARTED_AT, "git_dirty", False)
    common.guard_tree(allow_dirty=True)
    readme = tmp_path / "README.md"
    readme.write_text("<!-- BEGIN t -->\n<!-- END t -->\n")
    common.replace_section(readme, "t", "body")
    assert readme.read_text() == "<!-- BEGIN t -->\nbody\n<!-- END t -->\n"


def test_quick_runs_write_under_the_ignored_out_folder(tmp_path):
    assert common.output_dir(tmp_path, quick=False) == tmp_path / "results"
    assert common.output_dir(tmp_path, quick=True) == tmp_path / "out" / "quick"
    assert common.output_dir(tmp_path, quick=True, sub="served") == tmp_path / "out" / "quick-served"
    assert common.output_dir(tmp_path, quick=False, sub="served") == tmp_path / "results" / "served"


def test_meta_names_the_cpu_and_the_features_that_move_matmul_speed(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx2 avx512f amx_bf16\n\n"
        "processor\t: 1\nmodel name\t: Some Xeon\nflags\t\t: fpu avx2 avx512f amx_bf16\n"
    )
    assert common.cpu_info(str(info)) == {"cpu_model": "Some Xeon", "cpu_features": ["avx2", "avx512f", "amx_bf16"]}
    assert common.cpu_info(str(tmp_path / "missing")) == {}


def test_a_served_run_of_settings_the_readme_has_no_section_for_adds_one(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(common.STARTED_AT, "git_dirty", False)
    monkeypatch.setitem(common.STARTED_AT, "git_sha", "9d95b8e49bfa")
    monkeypatch.setitem(common._RUN, "dirty_allowed", False)
    monkeypatch.setattr(common.sys, "argv", ["served.py", "--systems", "ours,holder"])
    study = tmp_path / "multi_agent"
    study.mkdir()
    (study / "README.md").write_text("# study\n\n<!-- BEGIN served -->\nfull\n<!-- END served -->\n")
    for table in ("| first |", "| second |"):
        common.publish_served(study, "bench", {"rows": []}, {"k": 1}, table, False, True, "served-ours-holder")
    text = (study / "README.md").read_text()
    assert text.count("<!-- BEGIN served-ours-holder -->") == 1 and "| second |" in text and "| first |" not in text
    assert "full" in text and "`python -m experiments.multi_agent.served --systems ours,holder`, at 9d95b8e." in text
    assert json.loads((study / "results" / "served-ours-holder" / "bench.json").read_text()) == {"rows": []}
    with pytest.raises(ValueError, match="no <!-- BEGIN other --> marker"):
        common.replace_section(study / "README.md", "other", "body")
