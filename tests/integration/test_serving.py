"""Serving on Ray: serve → submit through ray:// → status → shutdown, and the e2e check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from graphflow.models.prefix_kernel import prefix_kernel
from graphflow.runtime.cluster import answers, ray_exe, stop_head
from tests.integration.helpers.cli import ENV
from tests.integration.helpers.cli import cli as _cli
from tests.integration.helpers.cli import last_json as _last_json

pytestmark = [pytest.mark.ray, pytest.mark.slow]

HEAD = "127.0.0.1:6379"
BYSTANDER = (  # NOTE: a second head here needs ports of its own, outside the first's worker ports (10002+)
    *("--head", "--port=6391", "--ray-client-server-port=9001", "--dashboard-agent-listen-port=52366"),
    *("--include-dashboard=false", "--disable-usage-stats", "--num-cpus=0"),
)

ABANDON = f"""
import time, ray
from graphflow.runtime.actors import RayCluster
from graphflow.runtime.plan import NodePlan
ray.init(address="{HEAD}", namespace="graphflow", log_to_driver=False)
cluster = RayCluster.attach(ray)
r0 = cluster.replicas[0]
ids = cluster.get(cluster.call(r0, "encode", "A client that leaves mid-run. " * 4))
cluster.manager("begin_run", "gone-run", cluster.owner)  # as the executor does
plan = NodePlan("gone-run:n1", tuple(ids), 1, next_use=(("gone-run:n1", 0),), owner=cluster.owner)
res = cluster.get(cluster.call(r0, "run_node", plan))
cluster.manager("apply", res.manager_events(), time.time())
assert cluster.get(cluster.call(r0, "stats")).protected_states == 1
"""
FORGOTTEN = f"""
import time, ray
from graphflow.runtime.actors import RayCluster
ray.init(address="{HEAD}", namespace="graphflow", log_to_driver=False)
cluster = RayCluster.attach(ray)
for _ in range(60):  # the manager's own watch finds the client gone (every 15 s)
    if not cluster.manager("run_owners"):
        break
    time.sleep(1.0)
assert not cluster.manager("run_owners")
assert "gone-run:n1" in cluster.manager("state_ids")  # ended: kept a while
cluster.manager("forget_ended", time.time() + 601)  # as the manager's actor does every minute
assert "gone-run:n1" not in cluster.manager("state_ids")
"""


def test_serve_submit_status_shutdown(tmp_path):
    subprocess.run([ray_exe(), "stop", "--force"], capture_output=True)  # a clean slate if an earlier run left Ray
    try:
        fuzzy = _cli("serve", "--model", "tiny-llama", "--kv-mode", "fuzzy", check=False)
        assert fuzzy.returncode == 2 and "unknown KV mode 'fuzzy'" in fuzzy.stderr
        # replicas no node has GPUs for: refused at once (Ray would keep them pending for ever), and the
        # head that serve started is stopped again, so the serve below starts one of its own. Served from a
        # home with no Ray token, as on a fresh machine: serve makes one before its head (`ray start` won't)
        fresh = {**ENV, "HOME": str(tmp_path)}
        fresh.pop("RAY_AUTH_TOKEN", None)
        cuda = ("--device", "cuda", "--gpus-per-replica", "4096")
        gpus = _cli("serve", "--model", "tiny-llama", *cuda, check=False, env=fresh)
        said = gpus.stderr.strip().splitlines()[-1]
        assert gpus.returncode == 2 and "could never start" in said and "--device cpu" in said, gpus.stderr[-2000:]
        assert (tmp_path / ".ray" / "auth_token").exists()
        served = _last_json(
            _cli(
                *("serve", "--model", "tiny-llama", "--replicas", "2", "--kv-mode", "differential"),
                *("--memory-price", "0.5", "--detach", "--json"),
            )
        )
        assert served["memory_price_s_per_gib"] == 0.5
        assert served["replicas"] == ["graphflow-replica-0", "graphflow-replica-1"]
        pairs = {(ln["src"], ln["dst"]) for ln in served["links"]}  # measured once per ordered pair, shared
        assert pairs == {("graphflow-replica-0", "graphflow-replica-1"), ("graphflow-replica-1", "graphflow-replica-0")}
        assert all(ln["bandwidth_bytes_per_s"] > 0 for ln in served["links"])
        steps = served["decode_steps"]  # the engine loop's decode steps, measured for placement
        assert steps["rows"] == [1, 2, 4, 8, 16] and steps["contention"] >= 1
        assert all(s > 0 for row in steps["seconds"] for s in row)
        # `serve` again on this machine, no --address: it serves on the head already running, and the
        # deployment of the same settings there is attached to (its calibration kept: nothing measured)
        again = _cli(
            *("serve", "--model", "tiny-llama", "--replicas", "2", "--kv-mode", "differential"),
            *("--memory-price", "0.5", "--detach", "--json"),
        )
        assert "a Ray head already runs on this machine" in again.stderr and _last_json(again)["measured"] == []
        other = _cli("serve", "--address", HEAD, "--model", "tiny-qwen2", "--detach", check=False)
        said = other.stderr.strip().splitlines()[-1]  # one sentence naming both (Ray logs its own lines first)
        assert other.returncode == 2 and "already serves 2 × tiny-llama" in said and "tiny-qwen2" in said
        task = "Add 17 and 25, then double the result. " * 6
        submitted = _cli("submit", "--address", "ray://127.0.0.1:10001", "--task", task, "--decode", "4", "--json")
        result = _last_json(submitted)
        assert result["trace"] and all(t["replica"].startswith("graphflow-replica-") for t in result["trace"])
        said = " ".join(submitted.stderr.split())  # progress on stderr: connecting, then each node as it finishes
        assert "connecting to the deployment" in said and all(
            f"{t['node']}: {t['decision']} on {t['replica']}" in said for t in result["trace"] if t["node"] != "ROOT"
        ), said
        # the user's own workflow (a chain of two, then a format), written as `generate --out` writes it
        mine = tmp_path / "mine.yaml"
        mine.write_text(
            "- name: mine\n  nodes: [{id: s, operator: Custom, role: SOLVE}, {id: r, operator: Review},"
            " {id: f, operator: Format}]\n  edges: [[s, r], [r, f]]\n  outputs: [f]\n"
        )
        given = _cli(
            *("submit", "--address", "ray://127.0.0.1:10001", "--task", task, "--decode", "2"),
            *("--workflow", str(mine), "--json"),
        )
        assert [t["node"] for t in _last_json(given)["trace"]] == ["ROOT", "s", "r", "f"]
        # a task given less time than its workflow takes: given up (exit 2), the deployment serves on
        late = _cli(
            *("submit", "--address", "ray://127.0.0.1:10001", "--task", task + " (late)", "--timeout", "0.001"),
            check=False,
        )
        assert late.returncode == 2 and "did not finish within 0.001 s" in late.stderr, late.stderr[-2000:]
        # a file of tasks through one client, two in flight; one too long for the model is refused alone
        tasks = tmp_path / "tasks.txt"
        tasks.write_text(f"{task}\n\nSort 3, 1, 2 and explain the order.\n{'word ' * 9000}\nName three primes.\n")
        many = _cli(
            "submit",
            "--address",
            "ray://127.0.0.1:10001",
            "--tasks-file",
            str(tasks),
            "--concurrency",
            "2",
            "--decode",
            "2",
            "--json",
            check=False,
        )
        assert many.returncode == 1  # a refused task: every outcome printed, then exit 1
        runs = _last_json(many)["runs"]
        assert [bool(r.get("error")) for r in runs] == [False, False, True, False], runs
        assert runs[2]["error"].startswith("the context needs") and "accepts at most" in runs[2]["error"]
        assert "\n" not in runs[2]["error"] and all(r["trace"] for r in runs if "trace" in r)  # one sentence
        assert runs[0]["task"] == task.strip() and _last_json(many)["tasks_per_s"] > 0
        said = " ".join(many.stderr.split())
        assert "running 4 workflows on 2 replicas" in said and "(4 of 4 done)" in said, said
        assert "1 of 4 tasks refused" in said, said
        wrong = _cli(
            "submit", "--address", "ray://127.0.0.1:10001", "--task", task, "--model", "smollm2-135m", check=False
        )
        assert wrong.returncode == 2 and "serves 'tiny-llama', not 'smollm2-135m'" in wrong.stderr
        status = _last_json(_cli("status", "--address", HEAD, "--json"))
        assert status["deployment"]["memory_price"] == 0.5 and status["deployment"]["kv_mode"] == "differential"
        assert len(status["replicas"]) == 2 and any(r["blocks"] > 0 for r in status["replicas"])
        assert {r["kv_mode"] for r in status["replicas"]} == {"differential"}
        # no --threads: the host's CPUs (as Ray counts them) shared by its two replicas
        assert {r["threads"] for r in status["replicas"]} == {max(1, (os.cpu_count() or 1) // 2)}
        assert {r["transport"] for r in status["replicas"]} == {"ucx"} and all(r["node"] for r in status["replicas"])
        assert sum(r["hits"] for r in status["replicas"]) > 0
        assert all(r["protected_states"] == 0 for r in status["replicas"])  # every run ended, the late one too
        # serve prefaults the whole capacity, and hands back a span of it for each span of KV computed
        pools = [(r["pool_bytes"], r["prefaulted_bytes"]) for r in status["replicas"]]
        assert all(0 < prefaulted - 64 * 2**20 < held <= prefaulted for held, prefaulted in pools), pools
        # one host: UCX connects the two replicas over shared memory, and status says so per ordered pair
        routes = {r["replica"]: {x["peer"]: x for x in r["routes"]} for r in status["replicas"]}
        for a, b in pairs:
            assert routes[a][b]["shared_memory"] and routes[a][b]["transports"], routes
        table = _cli("status", "--address", HEAD).stdout
        assert (
            "serving 2 × tiny-llama (differential KV" in table
            and f"cpu ×{max(1, (os.cpu_count() or 1) // 2)}" in table
            and "pool MiB" in table
            and "routes" in table
            and "shared memory" in table
            and "network" not in table.split("routes", 1)[1]
        )
        # the replicas ran the nodes through their engine loops (batching is the default)
        assert all(r["batching"] for r in status["replicas"]) and sum(r["engine_steps"] for r in status["replicas"]) > 0
        # each loop measured at its start which steps to pad: (rows, rows run), each padded upwards, within 16
        assert all(n < m <= 16 for r in status["replicas"] for n, m in r["padded_rows"]), status["replicas"]
        # and read stored prefixes in place where this host builds the kernel
        why = prefix_kernel().missing
        reading = f"in place ({prefix_kernel().isa})" if not why else f"gathered a layer at a time: {why}"
        assert all(r["prefix_reading"] == reading for r in status["replicas"]), status["replicas"]
        # the sweep between the deployment's served replicas: one ordered pair, its link as serve measured it
        sweep = _last_json(
            _cli(
                "sweep",
                "transfer-vs-recompute",
                "--address",
                "ray://127.0.0.1:10001",
                "--model",
                "tiny-llama",
                "--contexts",
                "64,160",
                "--repeats",
                "1",
                "--pairs",
                "replica-0:replica-1",
                "--out",
                str(tmp_path),
                "--json",
            )
        )
        assert sweep["points"] == 2 and sweep["pairs"] == ["replica-0>replica-1"] and sweep["links_gbps"]
        assert (tmp_path / "sweep.csv").read_text().splitlines()[0].startswith("model,link,src,dst,")
        bad = subprocess.run(
            [sys.executable, "-m", "graphflow.cli", "status", "--address", "127.0.0.1:6379"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**ENV, "RAY_AUTH_TOKEN": "not-the-token-0123456789"},
        )
        assert bad.returncode == 2 and "token" in bad.stderr.splitlines()[-1]
        # a client gone mid-run (it ran a node that protects a state, then exited without ending its run):
        # the replica asks Ray, finds its job ended, ends the run, and the state is evictable again
        left = subprocess.run([sys.executable, "-c", ABANDON], env=ENV, capture_output=True, text=True, timeout=300)
        assert left.returncode == 0, left.stderr[-3000:]
        for _ in range(20):
            replicas = _last_json(_cli("status", "--address", HEAD, "--json"))["replicas"]
            if sum(r["abandoned_runs"] for r in replicas) == 1:
                break
        assert [(r["protected_states"], r["abandoned_runs"]) for r in replicas] == [(0, 1), (0, 0)], replicas
        # ... and the manager ends that run too, which forgets its records once they are old enough
        told = subprocess.run([sys.executable, "-c", FORGOTTEN], env=ENV, capture_output=True, text=True, timeout=300)
        assert told.returncode == 0, told.stderr[-3000:]
        held = _last_json(_cli("status", "--address", HEAD, "--json"))["manager"]
        assert (held["running_runs"], held["abandoned_runs"]) == (0, 1) and held["snapshot_s"] > 0, held
        # another Ray on this machine, which shutdown must leave running
        subprocess.run([ray_exe(), "start", *BYSTANDER], capture_output=True, env=ENV, timeout=120, check=True)
    finally:
        stopped = _last_json(_cli("shutdown", "--address", HEAD, "--json"))
    assert len(stopped["stopped"]) == 2 and stopped["head_stopped"] is True  # the head serve started, here
    assert _cli("status", "--address", HEAD, check=False, timeout=120).returncode == 2  # nothing answers there now
    assert answers("127.0.0.1:6391") and stop_head("127.0.0.1:6391") > 3  # the bystander ran on, until now
    assert not answers("127.0.0.1:6391")
    unreachable = _cli("status", "--address", "127.0.0.1:6390", check=False, timeout=120)
    assert unreachable.returncode == 2
    # Ray's record of a head that died without `ray stop`: `auto` says so at once (Ray retried it for minutes)
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:6390")
    stale = _cli("status", check=False, timeout=60, env={**ENV, "RAY_TMPDIR": str(tmp_path)})
    assert stale.returncode == 2 and "where nothing answers" in stale.stderr, stale.stderr[-2000:]


def _stopped_by_sigterm(
    args: tuple[str, ...], ready: str, at_ready: Callable[[int], object] = lambda _pid: None
) -> str:
    """Run ``graphflow *args`` in a process group of its own; once a line of its stderr holds
    ``ready``, call ``at_ready(pid)`` and send the group SIGTERM (as `timeout`, a closing
    terminal's SIGHUP or a service manager do). Returns its stderr, ``exit status N`` last."""
    import signal
    import threading

    proc = subprocess.Popen(
        [sys.executable, "-m", "graphflow.cli", *args],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    said: list[str] = []
    up = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            said.append(line)
            if ready in line:
                up.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert up.wait(300), "".join(said)[-3000:]
        at_ready(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(10)
    return "".join(said) + f"\nexit status {proc.returncode}"


def test_a_foreground_serve_stopped_by_sigterm_stops_what_it_started():
    """SIGTERM to the serve's whole process group stops the replicas, the manager and the head it
    started, as Ctrl-C does; the head's processes, in a session of their own, never get the
    signal themselves."""
    from graphflow.runtime import head_processes as hp

    subprocess.run([ray_exe(), "stop", "--force"], capture_output=True)
    told = _stopped_by_sigterm(("serve", "--model", "tiny-llama", "--replicas", "1"), "serving until")
    assert told.endswith("exit status 0") and "and the Ray head serve started (SIGTERM)" in told, told[-3000:]
    assert not answers(HEAD) and not hp.head_processes(6379, hp.running_processes(), hp.local_addresses())


def test_an_embedded_command_stopped_by_sigterm_ends_its_ray_and_exits_143():
    """SIGTERM to a command that started an embedded Ray stops it as Ctrl-C does: exit 128 + 15,
    no stack dump from Ray's handler, and the Ray processes it started end."""
    import time

    import psutil

    started: list[psutil.Process] = []
    told = _stopped_by_sigterm(
        ("demo", "--model", "tiny-llama", "--replicas", "1", "--tasks", "2"),
        "run 1/",  # NOTE: Ray and the replica are up
        lambda pid: started.extend(psutil.Process(pid).children(recursive=True)),
    )
    assert started, "the demo started no Ray processes"
    assert told.endswith("exit status 143") and "SIGTERM received" not in told, told[-3000:]
    deadline = time.monotonic() + 60
    while (left := [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]) and (
        time.monotonic() < deadline
    ):
        time.sleep(1)
    assert not left, [str(p) for p in left]


def test_check_e2e_exact_mode():
    r = _last_json(_cli("check", "e2e", "--replicas", "2", "--branches", "4", "--model", "tiny-llama", "--json"))
    assert r["outputs_identical"] is True
    assert r["transport"] == "ucx" and r["bytes_moved"] > 0 and r["root_prefill_tokens"] > 0
    # saved is net of the root's one prefill: it closes the books against the reuse-off run
    assert 0 < r["prefill_tokens_saved"] == r["prefill_tokens_no_reuse"] - r["prefill_tokens_reuse"]
    assert r["decisions"]["ROOT"] == "materialize" and "transfer" in r["decisions"].values()


RECONSTRUCT = """
import json
from graphflow.client import connect
from graphflow.workflow.corpus import load_corpus, references
client = connect(None, model="smollm2-shape", replicas=2, decode_steps=2, kv_mode="differential", recompute_head=0,
                 capacity_mib=256)
wf = references(load_corpus())["GSM8K"]
rows = []
for i in range(6):
    r = client.run(f"Problem {i}: a cart moves {i + 3} metres a second for 9 seconds. How far? " * 8, wf)
    rows += [{"run": i, "node": t.node, "decision": t.decision, "rebuilt": t.rebuilt_tokens} for t in r.nodes]
    rows += [{"run": i, "predicted": {o.value: s for o, s in d.predicted_s.items()}, "chosen": d.option.value}
             for d in r.decisions]
print(json.dumps(rows))
"""


def test_differential_deployment_reconstructs_where_the_policy_prices_it_lowest():
    proc = subprocess.run([sys.executable, "-c", RECONSTRUCT], capture_output=True, text=True, env=ENV, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    done = [r for r in rows if r.get("decision") == "reconstruct"]
    assert done and all(r["rebuilt"] > 0 for r in done)  # the replica applied the residual the plan named
    chosen = [r for r in rows if r.get("chosen") == "reconstruct"]
    assert chosen and all(r["predicted"]["reconstruct"] == min(r["predicted"].values()) for r in chosen)
