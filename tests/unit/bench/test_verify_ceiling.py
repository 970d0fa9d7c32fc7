from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from graphflow.bench.verify_ceiling import verify_ceiling
from graphflow.cli import app


def test_rows_time_every_way_of_copying_and_verifying():
    rows = verify_ceiling([3 << 18, 9 << 20], block_bytes=1 << 18, repeats=3)  # NOTE: 9 MiB is two messages
    assert [r.nbytes for r in rows] == [3 << 18, 9 << 20]
    for row in rows:
        r = row.to_json()
        times = ("copy_s", "copy_then_hash_s", "copy_and_hash_s", "copy_and_hash_shared_s", "copy_contended_s")
        assert min(r[k] for k in times) > 0
        assert r["ratio_copy_then_hash"] == pytest.approx(r["copy_s"] / r["copy_then_hash_s"])
        assert r["ratio_copy_and_hash_shared"] == pytest.approx(r["copy_s"] / r["copy_and_hash_shared_s"])
        assert r["copy_slowdown_contended"] == pytest.approx(r["copy_s"] / r["copy_contended_s"])


def test_refuses_sizes_that_are_not_positive():
    with pytest.raises(ValueError, match="positive"):
        verify_ceiling([0])


def test_cli_json_is_the_last_line():
    result = CliRunner().invoke(app, ["bench", "verify-ceiling", "--sizes", "1MiB", "--repeats", "2", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output.strip().splitlines()[-1])["rows"]
    assert [r["nbytes"] for r in rows] == [1 << 20]


def test_cli_bad_size_is_one_clear_line():
    result = CliRunner().invoke(app, ["bench", "verify-ceiling", "--sizes", "lots"])
    assert result.exit_code == 2
    assert "cannot read size 'lots'" in result.output
