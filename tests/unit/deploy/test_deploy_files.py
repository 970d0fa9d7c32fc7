from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def test_ray_launcher_yaml():
    cfg = yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())
    assert cfg["head_node_type"] in cfg["available_node_types"]
    assert any("RAY_AUTH_MODE=token" in c for c in cfg["head_start_ray_commands"])
    assert any("--ray-client-server-port=10001" in c for c in cfg["head_start_ray_commands"])
    # the head's client proxy forks a server per client: gRPC's fork handlers off there (Ray #63202)
    assert any("GRPC_ENABLE_FORK_SUPPORT=0 ray start --head" in c for c in cfg["head_start_ray_commands"])
    workers = cfg["available_node_types"]["a100-worker"]
    assert workers["resources"]["GPU"] == 8
    assert any("UCX_TLS" in c and "rc" in c for c in cfg["worker_setup_commands"])


def test_kuberay_manifest_uses_token_auth_everywhere():
    doc = yaml.safe_load((DEPLOY / "kuberay-raycluster.yaml").read_text())
    assert doc["kind"] == "RayCluster" and doc["spec"]["rayVersion"] == "2.60.0"
    pods = [doc["spec"]["headGroupSpec"]["template"]] + [g["template"] for g in doc["spec"]["workerGroupSpecs"]]
    for pod in pods:
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "graphflow-ray-token"
    head_env = {e["name"]: e for e in pods[0]["spec"]["containers"][0]["env"]}
    assert head_env["GRPC_ENABLE_FORK_SUPPORT"]["value"] == "0"


def test_slurm_script_is_valid_bash():
    script = DEPLOY / "slurm" / "start-ray.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "RAY_AUTH_MODE=token" in text and "graphflow serve" in text
    assert "--spread" in text and '--node-ip-address="$head_ip"' in text  # one replica per node, head reachable
    assert "UCX_TLS=${UCX_TLS:-" in text  # a cluster without InfiniBand sets its own transports
    assert "env GRPC_ENABLE_FORK_SUPPORT=0 ray start --head" in text
    assert "ray get-auth-token --generate" in text  # `ray start` makes no token on a fresh cluster
    assert "sleep 20" not in text and '--min-nodes "${#nodes[@]}"' in text  # waits for nodes, not a clock
