"""``graphflow cluster up`` starting Ray itself (the development harness the README uses), on a
machine with no Ray token yet: the head and a worker join one cluster, and ``cluster down``
leaves nothing. (``test_multinode`` starts its Ray with the Slurm script instead.)"""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.helpers.cli import ENV, cli, last_json
from tests.integration.helpers.netns import leftovers, namespaces_allowed

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.netns]


def _pids(namespace: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()


def test_cluster_up_starts_a_two_node_ray_cluster_on_a_fresh_machine_and_down_removes_it(tmp_path):
    if not namespaces_allowed():
        pytest.skip("network namespaces cannot be created here (needs root and iproute2)")
    env = {**ENV, "HOME": str(tmp_path)}  # no ~/.ray/auth_token: `up` must make one
    env.pop("RAY_AUTH_TOKEN", None)
    try:
        up = last_json(cli("cluster", "up", "--nodes", "2", "--link", "1gbit", "--json", env=env))
        # `up` returns once both nodes joined the head (it asks the head how many are alive)
        assert up["ray_started"] is True and up["client_address"] == "ray://10.233.0.1:10001"
        assert (tmp_path / ".ray" / "auth_token").exists()
        assert _pids("gfc-node-0") and _pids("gfc-node-1")  # each node's raylet in its namespace
        state = last_json(cli("cluster", "status", "--json", env=env))
        assert state["running"] and state["head_address"] == "10.233.0.1:6379"
        # serving on it without --spread: Ray picks the replicas' nodes, and serve says that the threads
        # default cannot share a node's cores then; shutdown leaves this head alone (serve did not start it)
        client = up["client_address"]
        served = cli("serve", "--address", client, "--model", "tiny-llama", "--detach", "--json", env=env)
        assert "Ray chose each replica's node" in " ".join(served.stderr.split())
        stopped = last_json(cli("shutdown", "--address", client, "--json", env=env))
        assert len(stopped["stopped"]) == 2 and stopped["head_stopped"] is False
        assert last_json(cli("cluster", "status", "--json", env=env))["running"]
    finally:
        down = last_json(cli("cluster", "down", "--json", env=env))
    assert down["namespaces"] == 2 and down["processes"] > 0
    assert leftovers() == {"namespaces": [], "links": []}
