"""A real multi-node Ray cluster of network namespaces: cluster up → serve --spread → a workflow
submitted through ray:// from the root namespace → shutdown → cluster down (nothing left)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.helpers.cli import ENV
from tests.integration.helpers.cli import cli as _cli
from tests.integration.helpers.cli import last_json as _last_json
from tests.integration.helpers.netns import leftovers, namespaces_allowed

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.netns]


RUN_FAN_OUT = """
import json, sys
from graphflow.workflow.shapes import fan_out_workflow
from graphflow.client import connect
client = connect(sys.argv[1])
c = client.cluster
task = "A warehouse ships 48 boxes a day and each box holds 12 items. " * 40
# each branch pinned to a replica in turn (alone, the scheduler keeps short branches on the holder)
pin = {"ROOT": c.replicas[0], **{f"b{i}": c.replicas[i % len(c.replicas)] for i in range(4)}}
on = client.run(task, workflow=fan_out_workflow(4), pin=pin)
off = client.run(task, workflow=fan_out_workflow(4), reuse=False, pin=pin)
hosts = {s.replica: s.host for s in client.status()}
print(json.dumps({"identical": on.outputs == off.outputs, "hosts": hosts,
                  "trace": [[t.node, t.replica, t.decision, t.source, t.bytes_moved] for t in on.nodes]}))
"""

RUN_NODE_FAILURE = """
import json, sys
from graphflow.workflow.shapes import fan_out_workflow
from graphflow.client import connect, new_run_id
from graphflow.harness.cluster import stop_node
from graphflow.workflow.compile import compile_workflow
client = connect(sys.argv[1])
c = client.cluster
task = "A school orders 36 crates of 24 pencils and hands out 5 per pupil. " * 40
ids = c.get(c.call(c.replicas[0], "encode", task))
gs = compile_workflow(fan_out_workflow(4))
killed = []
def kill_node_2(trace):
    if not killed:  # after the first node finishes, while the other branches run
        killed.append(stop_node(2))
pin = {"b1": "graphflow-replica-2", "b3": "graphflow-replica-2", "join": "graphflow-replica-2"}
on = client.executor.run(gs, ids, new_run_id(), on_node=kill_node_2, pin=pin)
off = client.executor.run(gs, ids, new_run_id(), reuse=False)
print(json.dumps({"identical": on.outputs == off.outputs, "killed": killed[0], "replicas": c.replicas,
                  "trace": [[t.node, t.replica, t.decision, t.note] for t in on.nodes]}))
"""


@pytest.fixture(scope="module")
def cluster():
    if not namespaces_allowed():
        pytest.skip("network namespaces cannot be created here (needs root and iproute2)")
    up = _last_json(_cli("cluster", "up", "--nodes", "3", "--link", "1gbit", "--json"))
    try:
        yield up
    finally:
        down = _last_json(_cli("cluster", "down", "--json"))
        assert down["namespaces"] == 3 and down["processes"] > 0
        assert leftovers() == {"namespaces": [], "links": []}
        assert _last_json(_cli("cluster", "down", "--json"))["namespaces"] == 0  # idempotent


@pytest.fixture(scope="module")
def served(cluster):
    """One deployment for the module: three replicas spread over the three nodes."""
    address = cluster["client_address"]
    assert address == "ray://10.233.0.1:10001" and len(cluster["nodes"]) == 3
    return _last_json(
        _cli(
            "serve", "--address", address, "--replicas", "3", "--spread", "--capacity-mib", "256", "--detach", "--json"
        )
    )


def test_spread_replicas_move_kv_across_nodes_and_outputs_match(cluster, served):
    address = cluster["client_address"]
    hosts = {p["replica"]: p["host"] for p in served["placement"]}
    assert sorted(hosts.values()) == ["10.233.0.1", "10.233.0.2", "10.233.0.3"]  # one replica per node
    assert len(served["links"]) == 6  # every ordered pair measured over its own link
    run = subprocess.run(
        [sys.executable, "-c", RUN_FAN_OUT, address], capture_output=True, text=True, env=ENV, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["identical"]
    crossed = [t for t in got["trace"] if t[2] == "transfer" and got["hosts"][t[1]] != got["hosts"][t[3]]]
    assert crossed and all(t[4] > 0 for t in crossed), got["trace"]
    assert got["hosts"] == hosts  # the replicas' own status agrees with serve's placement (the CLI's: below)


def test_a_node_that_dies_mid_workflow_is_survived_and_one_that_returns_is_used_again(cluster, served):
    address = cluster["client_address"]
    run = subprocess.run(
        [sys.executable, "-c", RUN_NODE_FAILURE, address], capture_output=True, text=True, env=ENV, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["identical"] and got["killed"] > 0
    assert "graphflow-replica-2" not in got["replicas"]  # the executor stopped using it
    assert all(t[1] != "graphflow-replica-2" for t in got["trace"] if t[0] == "join")
    assert any("graphflow-replica-2 lost" in t[3] for t in got["trace"]), got["trace"]  # the trace says why
    status = _last_json(_cli("status", "--address", address, "--json"))
    assert [r["replica"] for r in status["replicas"]] == ["graphflow-replica-0", "graphflow-replica-1"]
    assert any(not n["alive"] and n["host"] == "10.233.0.3" for n in status["nodes"])
    _cli("cluster", "start-node", "2")
    again = _last_json(
        _cli(
            "serve", "--address", address, "--replicas", "3", "--spread", "--capacity-mib", "256", "--detach", "--json"
        )
    )
    assert sorted(p["host"] for p in again["placement"]) == ["10.233.0.1", "10.233.0.2", "10.233.0.3"]
    _cli("shutdown", "--address", address, "--no-stop-head", "--json")
