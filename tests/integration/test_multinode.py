"""A real multi-node deployment on one machine, followed as ``deploy/README.md`` says.

Three network namespaces stand in for three Slurm nodes (``cluster up --no-ray``; node 2 sits
behind 50 Mbit/s, nodes 0 and 1 share 1 Gbit/s). ``deploy/slurm/start-ray.sbatch`` runs on
node 0 as sbatch would (test stand-ins for ``srun``, ``scontrol`` and ``hostname`` in
``helpers/slurm``): it starts the Ray head and workers and a ``--spread`` deployment of four
SmolLM2-shaped replicas, the fourth sharing node 0 with the first. From the root namespace
over ``ray://``, the tests then

1. check placement and submit a task (``status``, ``submit``);
2. run a 4-branch workflow: the fast pair transfers a branch's context, the node behind the
   slow link recomputes it (the policy priced both from the links ``serve`` measured), the
   replicas of node 0 move KV over shared memory, and the outputs equal a reuse-off run;
3. kill node 2 mid-workflow: the workflow completes on the others, ``status`` shows the node
   gone; the node comes back and the same ``serve`` gives it a replica again, re-measuring
   only that replica's links;

and ``cluster down`` leaves nothing behind. One deployment serves all three, and tests 2 and
3 share one client: starting a deployment (a Ray cluster, four replicas, their calibration)
and connecting to it are most of what these tests cost.
"""

from __future__ import annotations

import json
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
MODEL = "smollm2-shape"  # 46 KB of KV a token: a context is worth moving over 1 Gbit/s, not over 50 Mbit/s
REPLICAS = "4"
HOSTS = ["10.233.0.1", "10.233.0.2", "10.233.0.3", "10.233.0.1"]  # replica i on node i mod 3


def _wait_for(path: Path, text: str, job: subprocess.Popen[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    got = ""
    while time.monotonic() < deadline:
        got = path.read_text() if path.exists() else ""
        if text in got:
            return got
        assert job.poll() is None, f"the batch script ended early:\n{got[-3000:]}"
        time.sleep(1.0)
    raise AssertionError(f"no {text!r} from the batch script within {timeout_s:.0f} s:\n{got[-3000:]}")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The Slurm script's deployment; afterwards ``cluster down`` and nothing left."""
    if not namespaces_allowed():
        pytest.skip("network namespaces cannot be created here (needs root and iproute2)")
    nodes_tmp = tempfile.mkdtemp(prefix="gfslurm-")  # NOTE: each node's /tmp/ray, bound there by the srun stand-in
    up = last_json(
        cli("cluster", "up", "--nodes", "3", "--link", "0-1=1gbit,0-2=50mbit,1-2=50mbit", "--no-ray", "--json")
    )
    assert up["ray_started"] is False and [n["namespace"] for n in up["nodes"]] == [f"gfc-node-{i}" for i in range(3)]
    home = tmp_path_factory.mktemp("home")  # NOTE: a fresh machine's: no Ray token yet, the script makes one
    clients = {**ENV, "HOME": str(home)}
    env = {
        **clients,
        "PATH": f"{STANDINS}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gfc-node-0,gfc-node-1,gfc-node-2",
        "GRAPHFLOW_MODEL": MODEL,
        "GRAPHFLOW_REPLICAS": REPLICAS,
        "UCX_TLS": "tcp,sm,self",  # what the script's comment says for a cluster without InfiniBand
        "GRAPHFLOW_STANDIN_TMP": nodes_tmp,
    }
    log = tmp_path_factory.mktemp("slurm") / "job.out"
    with open(log, "w") as out:  # NOTE: sbatch runs the script on the allocation's first node
        job = subprocess.Popen(
            [str(STANDINS / "srun"), "-w", "gfc-node-0", "bash", str(SCRIPT)],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
    try:
        printed = _wait_for(log, "submit with:", job, timeout_s=480)
        yield {"printed": printed, "env": clients, "token": home / ".ray" / "auth_token"}
    finally:
        job.kill()
        down = last_json(cli("cluster", "down", "--json"))
        shutil.rmtree(nodes_tmp, ignore_errors=True)
        assert down["namespaces"] == 3 and down["processes"] > 0  # the script's Ray processes went with them
        assert leftovers() == {"namespaces": [], "links": []}
        assert last_json(cli("cluster", "down", "--json"))["namespaces"] == 0  # idempotent


def test_the_slurm_script_spreads_replicas_over_nodes_and_serves_from_the_root_namespace(deployment):
    assert f"--address {CLIENT}" in deployment["printed"]
    assert deployment["token"].exists()  # made by the script; the clients below read it
    env = deployment["env"]
    status = last_json(cli("status", "--address", CLIENT, "--json", env=env))
    assert [r["host"] for r in status["replicas"]] == HOSTS  # --spread: round-robin, the head first
    cpus = os.cpu_count() or 1  # NOTE: each node's Ray counts the machine's CPUs (the script gives no --num-cpus)
    shared = [max(1, cpus // HOSTS.count(h)) for h in HOSTS]  # no --threads: a node's CPUs shared by its replicas
    assert [r["threads"] for r in status["replicas"]] == shared, status["replicas"]
    assert all(r["transport"] == "ucx" for r in status["replicas"])
    task = "A farm packs 30 crates of 12 eggs and sells 7 crates. How many eggs are left? " * 4
    result = last_json(cli("submit", "--address", CLIENT, "--task", task, "--decode", "4", "--json", env=env))
    # a random-weight model's four tokens may decode to nothing; every node ran and answered
    assert isinstance(result["final"], str) and result["trace"]
    assert all(t["replica"].startswith("graphflow-replica-") for t in result["trace"])


SESSION = """
import json, sys
from graphflow.client import connect, new_run_id
from graphflow.harness.cluster import stop_node
from graphflow.workflow.compile import compile_workflow
from graphflow.workflow.shapes import fan_out_workflow
client = connect(sys.argv[1], decode_steps=2)
print(json.dumps({"connected": True}), flush=True)
for line in sys.stdin:  # one snippet a line (JSON): it runs with the client and sets `result`
    scope = {**globals(), "c": client.cluster}
    exec(json.loads(line), scope)
    print(json.dumps(scope["result"]), flush=True)
"""


class Session:
    """One ray:// client in the root namespace for the tests below (a connection costs ~15 s
    here: the Ray client server starts a process for it, which imports what it unpickles)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SESSION, CLIENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._answer() == {"connected": True}

    def run(self, code: str) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(code) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def _answer(self) -> dict:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=60)
            raise AssertionError(f"the client session ended:\n{self.proc.stderr.read()[-3000:]}")
        return json.loads(line)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def session(deployment):
    s = Session(deployment["env"])
    try:
        yield s
    finally:
        s.close()


LINKS = """
task = "A farm packs 18 crates of 30 eggs each morning and sells 7 crates by noon. " * 10
ids = c.get(c.call(c.replicas[0], "encode", task))
gs = compile_workflow(fan_out_workflow(4))
pin = {"ROOT": "graphflow-replica-0", "b1": "graphflow-replica-1", "b2": "graphflow-replica-2",
       "b3": "graphflow-replica-3"}
on = client.executor.run(gs, ids, new_run_id(), pin=pin)
off = client.executor.run(gs, ids, new_run_id(), pin=pin, reuse=False)
rows = {t.node: [t.replica, t.decision, t.bytes_moved, t.source] for t in on.nodes}
predicted = {t.node: {o.value: s for o, s in d.predicted_s.items()} for t, d in zip(on.nodes, on.decisions)}
links = {f"{a[-1]}>{b[-1]}": ln.bandwidth_bytes_per_s for (a, b), ln in client.executor.links.pairs.items()}
stats = client.status()
routes = {s.replica[-1]: {r.peer[-1]: [list(r.transports), r.shared_memory] for r in s.routes} for s in stats}
result = {"rows": rows, "predicted": predicted, "links": links, "routes": routes,
          "identical": on.outputs == off.outputs, "hosts": {s.replica[-1]: s.host for s in stats}}
"""


def test_the_slow_node_recomputes_the_fast_pair_transfers_and_outputs_match_reuse_off(session):
    got = session.run(LINKS)
    assert got["identical"], got
    hosts, bw = got["hosts"], got["links"]
    assert [hosts[str(i)] for i in range(4)] == HOSTS
    assert bw["0>1"] > 5 * bw["0>2"]  # the matrix serve measured tells the pairs apart (1 Gbit/s vs 50 Mbit/s)
    assert bw["0>3"] > 2 * bw["0>1"]  # one node: shared memory, not the 1 Gbit/s veth
    b1, b2, b3 = got["rows"]["b1"], got["rows"]["b2"], got["rows"]["b3"]
    # fast pair: the context crosses nodes over UCX
    assert b1 == ["graphflow-replica-1", "transfer", b1[2], "graphflow-replica-0"] and b1[2] > 0, got
    assert b2[:3] == ["graphflow-replica-2", "recompute", 0], got  # slow node: recomputed there
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


NODE_FAILURE = """
task = "A school orders 36 crates of 24 pencils and hands out 5 per pupil. " * 6
ids = c.get(c.call(c.replicas[0], "encode", task))
gs = compile_workflow(fan_out_workflow(4))
killed = []
def kill_node_2(trace):
    if not killed:  # after the first node finishes, while the other branches run
        killed.append(stop_node(2))
pin = {"b1": "graphflow-replica-2", "b3": "graphflow-replica-2", "join": "graphflow-replica-2"}
on = client.executor.run(gs, ids, new_run_id(), on_node=kill_node_2, pin=pin)
off = client.executor.run(gs, ids, new_run_id(), reuse=False)
# what `graphflow status` reads (its own connection is checked in the first test)
status = {"replicas": [s.replica for s in c.stats()], "nodes": [[n.host, n.alive] for n in c.nodes()]}
result = {"identical": on.outputs == off.outputs, "killed": killed[0], "replicas": c.replicas,
          "trace": [[t.node, t.replica, t.decision, t.note] for t in on.nodes], "status": status}
"""


def test_a_node_that_dies_mid_workflow_is_survived_and_one_that_returns_is_used_again(deployment, session):
    got = session.run(NODE_FAILURE)
    assert got["identical"] and got["killed"] > 0
    assert "graphflow-replica-2" not in got["replicas"]  # the executor stopped using it
    assert all(t[1] != "graphflow-replica-2" for t in got["trace"] if t[0] == "join")
    assert any("graphflow-replica-2 lost" in t[3] for t in got["trace"]), got["trace"]  # the trace says why
    assert [r[-1] for r in got["status"]["replicas"]] == ["0", "1", "3"]
    assert ["10.233.0.3", False] in got["status"]["nodes"]  # status shows node 2 gone
    env = deployment["env"]
    cli("cluster", "start-node", "2", env=env)
    # the same serve as the script's: replica-2 again, on node 2; only its pairs are measured again
    again = last_json(
        cli(
            "serve",
            *("--address", CLIENT, "--model", MODEL, "--replicas", REPLICAS),
            *("--spread", "--detach", "--json"),
            env=env,
        )
    )
    assert [p["host"] for p in again["placement"]] == HOSTS
    assert len(again["links"]) == 12
    assert sorted(again["measured"]) == sorted(
        f"graphflow-replica-{a}>graphflow-replica-{b}" for a, b in ((2, 0), (2, 1), (2, 3), (0, 2), (1, 2), (3, 2))
    )
    # NOTE: no `graphflow shutdown` (test_serving runs it): `cluster down` stops the whole cluster
