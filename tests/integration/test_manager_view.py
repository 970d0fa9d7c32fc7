"""The manager's view of a served deployment under load: two clients at once, a KV budget small
enough that replicas evict all the time; once they are done, the manager lists exactly the block
copies the replicas hold (results reach it in the order clients collect them, not the order the
replicas made the changes: ``graphflow.kv.copy_order``), and a state released afterwards, with no
further call, reaches it within seconds (the replica reports it: ``runtime.deliveries``)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from graphflow.runtime.cluster import ray_exe
from graphflow.runtime.replica_actor import WAITING_REPORT_S
from tests.integration.helpers.cli import ENV
from tests.integration.helpers.cli import cli as _cli
from tests.integration.helpers.cli import last_json as _last_json

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CLIENT = ("submit", "--address", "ray://127.0.0.1:10001", "--concurrency", "4", "--decode", "8", "--tasks-file")
RELEASE = """
import ray
from graphflow.runtime.actors import RayCluster
ray.init(address="ray://127.0.0.1:10001", namespace="graphflow", log_to_driver=False)
cluster = RayCluster.attach(ray)
# newest first, until a release frees bytes: two clients sent the same tasks, so a state's blocks
# may all be shared with another state the replica keeps, and releasing it alone frees nothing
freed = 0
for replica in cluster.replicas:
    for admit in reversed(cluster.get(cluster.call(replica, "holdings"))):
        freed += cluster.get(cluster.call(replica, "release", admit.record.state.state_id))
        if freed:
            break
    if freed:
        break
print(freed)
"""


def test_two_clients_under_eviction_leave_the_manager_listing_what_the_replicas_hold(tmp_path):
    subprocess.run([ray_exe(), "stop", "--force"], capture_output=True)  # a clean slate if an earlier run left Ray
    base = "A train leaves at 9 and travels 60 km per hour. How far has it gone by noon? " * 4
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("".join(f"{base} Variant {i % 5}: show step {i}.\n" for i in range(24)))
    _cli("serve", "--model", "tiny-llama", "--capacity-mib", "1", "--detach", "--json")
    try:
        clients = [
            subprocess.Popen(
                [sys.executable, "-m", "graphflow.cli", *CLIENT, str(tasks)],
                env=ENV,
                text=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for _ in range(2)
        ]
        for c in clients:
            _, err = c.communicate(timeout=300)
            assert c.returncode == 0, err[-3000:]
        status = _last_json(_cli("status", "--json"))
        held = sum(r["blocks"] for r in status["replicas"])
        manager = status["manager"]
        assert manager["catalog_rows"] > manager["live_copies"]  # replicas evicted: the budget was tight
        assert manager["live_copies"] == held, (manager, [r["blocks"] for r in status["replicas"]])
        # a state released by hand, and no further call: the replica reports the eviction itself
        freed = subprocess.run([sys.executable, "-c", RELEASE], env=ENV, capture_output=True, text=True, timeout=120)
        assert freed.returncode == 0 and int(freed.stdout.split()[-1]) > 0, freed.stderr[-3000:]
        deadline = time.monotonic() + 4 * WAITING_REPORT_S
        while time.monotonic() < deadline:
            status = _last_json(_cli("status", "--json"))
            if not sum(r["evictions_waiting"] for r in status["replicas"]):
                break
            time.sleep(1)
        assert not sum(r["evictions_waiting"] for r in status["replicas"]), status["replicas"]
        held_now = sum(r["blocks"] for r in status["replicas"])
        assert held_now < held and status["manager"]["live_copies"] == held_now, status["manager"]
    finally:
        _cli("shutdown", "--json", check=False)
