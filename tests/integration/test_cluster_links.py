"""The measured link matrix reaches the policy on a real multi-node cluster: node 2 sits behind
50 Mbit/s, nodes 0 and 1 share 1 Gbit/s; with SmolLM2-shaped KV (46 KB a token) the fast pair
transfers a branch's context and the slow node recomputes it. A fourth replica shares node 0
with the first: UCX connects those two over shared memory, every other pair over tcp."""

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

RUN = """
import json, sys
from graphflow.workflow.shapes import fan_out_workflow
from graphflow.client import connect, new_run_id
from graphflow.workflow.compile import compile_workflow
client = connect(sys.argv[1], decode_steps=2)
c = client.cluster
task = "A farm packs 18 crates of 30 eggs each morning and sells 7 crates by noon. " * 20
ids = c.get(c.call(c.replicas[0], "encode", task))
gs = compile_workflow(fan_out_workflow(4))
pin = {"ROOT": "graphflow-replica-0", "b1": "graphflow-replica-1", "b2": "graphflow-replica-2",
       "b3": "graphflow-replica-3"}
on = client.executor.run(gs, ids, new_run_id(), pin=pin)
rows = {t.node: [t.replica, t.decision, t.bytes_moved] for t in on.nodes}
predicted = {t.node: {o.value: s for o, s in d.predicted_s.items()} for t, d in zip(on.nodes, on.decisions)}
links = {f"{a}>{b}": ln.bandwidth_bytes_per_s for (a, b), ln in client.executor.links.pairs.items()}
routes = {s.replica[-1]: {r.peer[-1]: [list(r.transports), r.shared_memory] for r in s.routes} for s in client.status()}
print(json.dumps({"rows": rows, "predicted": predicted, "links": links, "context": len(ids), "routes": routes}))
"""


@pytest.fixture(scope="module")
def slow_node():
    if not namespaces_allowed():
        pytest.skip("network namespaces cannot be created here (needs root and iproute2)")
    up = _last_json(_cli("cluster", "up", "--nodes", "3", "--link", "0-1=1gbit,0-2=50mbit,1-2=50mbit", "--json"))
    try:
        yield up
    finally:
        _cli("cluster", "down", "--json")
        assert leftovers() == {"namespaces": [], "links": []}


def test_slow_node_recomputes_and_the_fast_pair_transfers(slow_node):
    address = slow_node["client_address"]
    served = _last_json(
        _cli(
            "serve",
            "--address",
            address,
            "--model",
            "smollm2-shape",
            "--replicas",
            "4",
            "--spread",
            "--capacity-mib",
            "512",
            "--detach",
            "--json",
        )
    )
    hosts = {p["replica"][-1]: p["host"] for p in served["placement"]}
    assert hosts["3"] == hosts["0"] and len({hosts["0"], hosts["1"], hosts["2"]}) == 3  # round-robin over nodes
    bw = {(ln["src"][-1], ln["dst"][-1]): ln["bandwidth_bytes_per_s"] for ln in served["links"]}
    assert bw[("0", "1")] > 5 * bw[("0", "2")]  # the matrix tells the pairs apart (1 Gbit/s vs 50 Mbit/s)
    assert bw[("0", "3")] > 2 * bw[("0", "1")]  # one node: shared memory, not the 1 Gbit/s veth
    run = subprocess.run([sys.executable, "-c", RUN, address], capture_output=True, text=True, env=ENV, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    b1, b2 = got["rows"]["b1"], got["rows"]["b2"]
    assert b1[:2] == ["graphflow-replica-1", "transfer"] and b1[2] > 0, got  # fast pair: the context moves
    assert b2[:2] == ["graphflow-replica-2", "recompute"] and b2[2] == 0, got  # slow node: recomputed there
    b3 = got["rows"]["b3"]
    assert b3[:2] == ["graphflow-replica-3", "transfer"] and b3[2] > 0, got  # same node: moved over shared memory
    routes = got["routes"]  # what `graphflow status` shows: each replica's UCX transports per peer
    for a, b in (("0", "3"), ("3", "0")):
        assert routes[a][b][1], routes[a][b]  # sysv / posix / cma, no network device
    veth = {r: f"tcp/gfc{int(h.rsplit('.', 1)[1]) - 1}" for r, h in hosts.items()}  # node i: 10.233.0.<i+1>, gfc<i>
    for a, b in (("0", "1"), ("0", "2"), ("3", "1"), ("1", "0"), ("2", "3")):
        assert routes[a][b][0] == [veth[a]], routes[a][b]  # other nodes: tcp on the sender's veth
    # the policy chose from the measured costs: moving the context to node 2 was priced higher
    assert got["predicted"]["b2"]["transfer"] > got["predicted"]["b2"]["recompute"], got
    assert got["predicted"]["b1"]["transfer"] < got["predicted"]["b1"]["recompute"], got
    # NOTE: no shutdown here: the fixture's `cluster down` stops everything (test_cluster runs shutdown)
