"""Serving on Ray: serve → submit through ray:// → status → shutdown, and the e2e check."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ENV = {**os.environ, "RAY_AUTH_MODE": "token", "HF_HUB_OFFLINE": "1"}
HEAD = "127.0.0.1:6379"


def _cli(*args: str, timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "graphflow.cli", *args], capture_output=True, text=True,
                          env=ENV, timeout=timeout)  # fmt: skip
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _last_json(proc: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_serve_submit_status_shutdown():
    _cli("shutdown", "--address", HEAD, "--json", check=False)  # a clean slate if an earlier run left a head
    try:
        fuzzy = _cli("serve", "--model", "tiny-llama", "--kv-mode", "fuzzy", check=False)
        assert fuzzy.returncode == 2 and "unknown KV mode 'fuzzy'" in fuzzy.stderr
        served = _last_json(_cli("serve", "--model", "tiny-llama", "--replicas", "2", "--kv-mode", "differential",
                                 "--detach", "--json"))  # fmt: skip
        assert served["replicas"] == ["graphflow-replica-0", "graphflow-replica-1"]
        assert served["kv_mode"] == "differential"
        assert served["link_bandwidth_bytes_per_s"] > 0  # measured once at serve, shared with clients
        task = "Add 17 and 25, then double the result. " * 6
        result = _last_json(_cli("submit", "--address", "ray://127.0.0.1:10001", "--task", task, "--decode", "4",
                                 "--json"))  # fmt: skip
        assert result["trace"] and all(t["replica"].startswith("graphflow-replica-") for t in result["trace"])
        wrong = _cli("submit", "--address", "ray://127.0.0.1:10001", "--task", task, "--model", "smollm2-135m",
                     check=False)  # fmt: skip
        assert wrong.returncode == 2 and "serves 'tiny-llama', not 'smollm2-135m'" in wrong.stderr
        status = _last_json(_cli("status", "--address", HEAD, "--json"))
        assert len(status["replicas"]) == 2 and any(r["blocks"] > 0 for r in status["replicas"])
        assert {r["kv_mode"] for r in status["replicas"]} == {"differential"}
        assert sum(r["hits"] for r in status["replicas"]) > 0
        bad = subprocess.run([sys.executable, "-m", "graphflow.cli", "status", "--address", "127.0.0.1:6379"],
                             capture_output=True, text=True, timeout=300,
                             env={**ENV, "RAY_AUTH_TOKEN": "not-the-token-0123456789"})  # fmt: skip
        assert bad.returncode == 2 and "token" in bad.stderr.splitlines()[-1]
    finally:
        stopped = _last_json(_cli("shutdown", "--address", HEAD, "--json"))
    assert len(stopped["stopped"]) == 2
    unreachable = _cli("status", "--address", "127.0.0.1:6390", check=False, timeout=120)
    assert unreachable.returncode == 2


def test_check_e2e_exact_mode():
    r = _last_json(_cli("check", "e2e", "--replicas", "2", "--branches", "4", "--model", "tiny-llama", "--json"))
    assert r["outputs_identical"] is True
    assert r["prefill_tokens_saved"] > 0
    assert r["transport"] == "ray"
