"""Two-process KV transfers on every backend, and failure behaviour (transport issue)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphflow.checks.transfer import TransferCheck, TransferCheckResult, run_transfer_check
from graphflow.harness.launch import mpirun_command

ROOT = Path(__file__).resolve().parents[2]


def _assert_resumed(result: TransferCheckResult) -> None:
    got = result.received
    assert got.tokens_equal is True and result.passed
    assert got.max_abs_logit_diff == 0.0
    assert got.same_config is True
    assert got.blocks == 13 and got.nbytes == 200 * 512
    assert result.to_json()["processes"] == result.processes and result.send_seconds > 0


@pytest.mark.ucx
def test_ucx_kv_state_between_processes():
    result = run_transfer_check("ucx", TransferCheck(tokens=200), timeout_s=30)
    assert result.processes == 2
    _assert_resumed(result)


@pytest.mark.ucx
def test_ucx_restricted_to_the_loopback_device(monkeypatch):
    monkeypatch.setenv("GRAPHFLOW_UCX_NET_DEVICES", "lo")
    probe = "from transport.ucx import UcxTransport; t = UcxTransport(); print(t.net_devices_in_use()); t.close()"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=os.environ)
    assert out.stdout.strip().splitlines()[-1] == "lo", out.stderr[-2000:]
    _assert_resumed(run_transfer_check("ucx", TransferCheck(tokens=200), timeout_s=30))  # both processes on lo


ROUTE_PROBE = """
import json
from transport.ucx import UcxTransport
t = UcxTransport()
before = t.routes()
t.run(t._endpoint(t.address))  # an endpoint to its own worker, as a same-host peer would get
after = t.routes()[t.address]
forgot = [t.forget_peer(t.address), t.routes(), t.forget_peer(t.address)]  # as for a replica that is gone
t.run(t._endpoint(t.address))  # the same address again: connected afresh
print(json.dumps({"before": before, "after": after, "forgot": forgot, "again": t.address in t.routes()}))
t.close()
"""


@pytest.mark.ucx
def test_ucx_reports_the_transports_it_chose_for_a_peer_and_forgets_a_gone_one():
    out = subprocess.run([sys.executable, "-c", ROUTE_PROBE], capture_output=True, text=True, timeout=60, env=_env())
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] == {}
    assert got["after"] and all(t.endswith("/memory") for t in got["after"]), got  # one host: no network device
    assert any(t.startswith(("sysv/", "posix/", "cma/", "self/")) for t in got["after"])
    assert got["forgot"] == [True, {}, False] and got["again"], got  # forgotten: endpoint and route gone


@pytest.mark.mpi
def test_mpi_kv_state_between_processes():
    result = run_transfer_check("mpi", TransferCheck(tokens=200), timeout_s=30)
    _assert_resumed(result)


def test_local_kv_state_between_threads():
    _assert_resumed(run_transfer_check("local", TransferCheck(tokens=200), timeout_s=30))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "UCX_WARN_UNUSED_ENV_VARS": "n"}


@pytest.mark.ucx
def test_ucx_sender_killed_mid_transfer_times_out(tmp_path):
    receiver = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.helpers.receiver", "ucx", str(tmp_path), "3"], env=_env(), cwd=ROOT
    )
    sender = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.helpers.dying_sender", "ucx", str(tmp_path)], env=_env(), cwd=ROOT
    )
    assert sender.wait(timeout=60) == 3
    start = time.monotonic()
    assert receiver.wait(timeout=60) == 0
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert outcome["outcome"] == "TransferTimeout"
    assert outcome["seconds"] < 3 + 2
    assert time.monotonic() - start < 10


@pytest.mark.mpi
def test_mpi_same_host_sender_writes_into_the_receiver(tmp_path):
    cmd = mpirun_command(2) + [sys.executable, "-m", "tests.integration.helpers.mpi_single_copy", str(tmp_path)]
    proc = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads((tmp_path / "outcome.json").read_text())
    sender = json.loads((tmp_path / "sender.json").read_text())
    assert got["single_copy_peers"] == [0] and sender["single_copy_peers"] == [1]
    assert got["off_peers"] == [] and sender["off_peers"] == []
    assert got["on"] == {"equal": True} and got["off"] == {"equal": True}
    assert sender["written"] == [2, 0]  # 11 MiB in two messages; the second transport used MPI's own copy
    assert got["refused"] == {"equal": True} and sender["refused_writes"] == 0
    assert got["flipped"] == "ChecksumMismatch"
    # a receive that gave up: the late sender refuses to write, the receive tensors stay as they were
    assert got["abandoned"] == "TransferTimeout"
    assert sender["late"] == "TransportError"
    assert got["into_untouched"] is True


@pytest.mark.mpi
def test_mpi_rank_killed_mid_transfer_ends_the_world(tmp_path):
    cmd = mpirun_command(2) + [sys.executable, "-m", "tests.integration.helpers.dying_sender", "mpi", str(tmp_path)]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, timeout=120)
    # mpirun tears the whole world down when a rank dies: no hang, no process left behind
    assert proc.returncode != 0
    assert time.monotonic() - start < 60
    left = subprocess.run(["pgrep", "-f", f"dying_sender mpi {tmp_path}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""
