"""The Ray side of the namespace cluster (:mod:`graphflow.harness.cluster`): each node's Ray,
started inside the node's namespaces so that it is a machine as Ray and UCX see one, and the
wait for the nodes to join. The network side (namespaces, bridge, shaped links) and ``down``
stay in ``cluster``."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

from graphflow.runtime.cluster import ray_exe
from graphflow.runtime.errors import Unavailable

__all__ = [
    "CLIENT_PORT",
    "GCS_PORT",
    "RAY_TEMP_DIR",
    "STATE_DIR",
    "RayNode",
    "node_tmp",
    "start_ray",
    "wait_nodes",
]

GCS_PORT = 6379
CLIENT_PORT = 10001
STATE_DIR = Path(os.environ.get("GRAPHFLOW_CLUSTER_DIR", "/tmp/graphflow-cluster"))
RAY_TEMP_DIR = STATE_DIR / "ray"


class RayNode(Protocol):
    """What starting a node's Ray needs of it (``cluster.ClusterNode``)."""

    @property
    def index(self) -> int: ...
    @property
    def namespace(self) -> str: ...
    @property
    def address(self) -> str: ...
    def exec_prefix(self) -> list[str]: ...
    def env(self) -> dict[str, str]: ...


def node_tmp(index: int) -> Path:
    """What node ``index`` sees as ``/tmp/ray`` (a machine's own: Ray keeps its sockets and
    logs there, and PIDs, which each node numbers from 1, name some of them)."""
    return STATE_DIR / "nodes" / str(index)


def start_ray(node: RayNode, cpus: int, head: str, timeout_s: float = 180.0) -> None:
    """Start node ``node``'s Ray (``ray start --block``, which stays as the first process of
    the node's PID namespace) and return once it is up; its output goes to ``ray.log`` in
    :func:`node_tmp`."""
    resources = json.dumps({f"graphflow-node-{node.index}": 1})
    common = [
        f"--node-ip-address={node.address}",
        f"--num-cpus={cpus}",
        f"--resources={resources}",
        "--disable-usage-stats",
        "--block",
    ]
    if node.index == 0:
        # NOTE: a temp dir of its own: Ray records a head's address in <temp>/ray_current_cluster, and an
        # embedded `ray.init()` in the root namespace would otherwise try to join this cluster
        role = [
            "--head",
            f"--port={GCS_PORT}",
            f"--ray-client-server-port={CLIENT_PORT}",
            "--include-dashboard=false",
            f"--temp-dir={RAY_TEMP_DIR}",
        ]
    else:
        role = [f"--address={head}"]
    tmp = node_tmp(node.index)
    tmp.mkdir(parents=True, exist_ok=True)
    ray = shlex.join([ray_exe(), "start", *role, *common])
    cmd = [
        *node.exec_prefix(),
        "unshare",
        "--pid",
        "--ipc",
        "--fork",
        "--mount-proc",
        "--propagation=private",
        "env",
        *(f"{k}={v}" for k, v in node.env().items()),
        "bash",
        "-c",
        f"mkdir -p /tmp/ray && mount --bind {shlex.quote(str(tmp))} /tmp/ray && exec {ray}",
    ]
    log = tmp / "ray.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while b"Ray runtime started" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace").strip()[-400:]
            raise Unavailable(f"could not start the Ray node in {node.namespace}: {tail or 'no output'}")
        time.sleep(0.2)


def wait_nodes(head_node: RayNode, head: str, n: int, timeout_s: float = 120.0) -> None:
    probe = (
        f"import ray; ray.init(address={head!r}, log_to_driver=False); print(sum(1 for x in ray.nodes() if x['Alive']))"
    )
    env = {**os.environ, **head_node.env()}
    deadline = time.monotonic() + timeout_s
    alive = 0
    while time.monotonic() < deadline:
        proc = subprocess.run(
            [*head_node.exec_prefix(), sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        lines = proc.stdout.strip().splitlines()
        alive = int(lines[-1]) if lines and lines[-1].isdigit() else 0
        if alive >= n:
            return
        time.sleep(1.0)
    raise Unavailable(f"only {alive} of {n} Ray nodes joined the cluster within {timeout_s:.0f} s")
