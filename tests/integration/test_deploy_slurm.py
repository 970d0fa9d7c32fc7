"""``deploy/slurm/start-ray.sbatch`` run step by step on the namespace cluster: three namespaces
stand in for three Slurm nodes (test stand-ins for ``srun``, ``scontrol`` and ``hostname`` in
``helpers/slurm``), the script itself runs on the first node as sbatch would run it, starts the
Ray head and workers and a spread deployment; a client in the root namespace then submits a
task over ``ray://`` and the replicas are found one per node."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.integration.helpers.cli import ENV, cli, last_json
from tests.integration.helpers.netns import leftovers, namespaces_allowed

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.netns]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "start-ray.sbatch"
STANDINS = Path(__file__).parent / "helpers" / "slurm"
CLIENT = "ray://10.233.0.1:10001"


def _wait_for(path: Path, text: str, job: subprocess.Popen[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = path.read_text() if path.exists() else ""
        if text in got:
            return got
        assert job.poll() is None, f"the batch script ended early:\n{got[-3000:]}"
        time.sleep(1.0)
    raise AssertionError(f"no {text!r} from the batch script within {timeout_s:.0f} s:\n{got[-3000:]}")


def test_the_slurm_script_starts_a_spread_deployment_that_serves_from_the_root_namespace(tmp_path):
    if not namespaces_allowed():
        pytest.skip("network namespaces cannot be created here (needs root and iproute2)")
    from graphflow.harness.cluster import cluster_down

    nodes_tmp = tempfile.mkdtemp(prefix="gfslurm-")  # NOTE: each node's /tmp/ray, bound there by the srun stand-in
    up = last_json(cli("cluster", "up", "--nodes", "3", "--link", "1gbit", "--no-ray", "--json"))
    assert up["ray_started"] is False and [n["namespace"] for n in up["nodes"]] == [f"gfc-node-{i}" for i in range(3)]
    env = {
        **ENV,
        "PATH": f"{STANDINS}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gfc-node-0,gfc-node-1,gfc-node-2",
        "GRAPHFLOW_MODEL": "tiny-llama",
        "GRAPHFLOW_REPLICAS": "3",
        "UCX_TLS": "tcp,self",
        "GRAPHFLOW_STANDIN_TMP": nodes_tmp,
    }
    log = tmp_path / "job.out"
    with open(log, "w") as out:  # NOTE: sbatch runs the script on the allocation's first node
        job = subprocess.Popen(
            [str(STANDINS / "srun"), "-w", "gfc-node-0", "bash", str(SCRIPT)],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
    try:
        printed = _wait_for(log, "submit with:", job, timeout_s=400)
        assert f"--address {CLIENT}" in printed
        status = last_json(cli("status", "--address", CLIENT, "--json"))
        hosts = sorted(r["host"] for r in status["replicas"])
        assert hosts == ["10.233.0.1", "10.233.0.2", "10.233.0.3"]  # --spread: one replica per node
        assert all(r["transport"] == "ucx" for r in status["replicas"])
        task = "A farm packs 30 crates of 12 eggs and sells 7 crates. How many eggs are left? " * 20
        result = last_json(cli("submit", "--address", CLIENT, "--task", task, "--decode", "4", "--json"))
        assert result["final"] and result["trace"]
        cli("shutdown", "--address", CLIENT, "--no-stop-head", "--json")
    finally:
        job.kill()
        down = cluster_down()
        shutil.rmtree(nodes_tmp, ignore_errors=True)
    assert down.namespaces == 3 and down.processes > 0  # the script's Ray processes went with them
    assert leftovers() == {"namespaces": [], "links": []}
