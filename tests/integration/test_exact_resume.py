"""The exact-resume check across two processes (foundation issue's acceptance)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _check(model: str, tokens: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "graphflow.cli", "check", "exact", "--model", model, "--tokens", str(tokens), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen2"])
def test_exact_resume_tiny(model):
    r = _check(model, 200)
    assert r["cross_process"] is True
    assert r["tokens_equal"] is True
    assert r["max_abs_logit_diff_vs_cache"] == 0.0
    assert r["blocks"] == 13
    assert r["max_abs_logit_diff_vs_recompute"] < 1e-3


@pytest.mark.slow
def test_exact_resume_smollm2():
    r = _check("smollm2-135m", 128)
    assert r["tokens_equal"] is True
    assert r["max_abs_logit_diff_vs_cache"] == 0.0
    assert r["tokens_equal_vs_recompute"] is True
