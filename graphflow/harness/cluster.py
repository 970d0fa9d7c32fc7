"""A real multi-node Ray cluster on one machine: one network namespace per node, one bridge.

```
 root namespace: bridge gfc-br0 10.233.0.254 ── the client (ray://10.233.0.1:10001)
     │ veth gfc0h            │ veth gfc1h            │ veth gfc2h
 netns gfc-node-0         netns gfc-node-1         netns gfc-node-2
  gfc0 10.233.0.1          gfc1 10.233.0.2          gfc2 10.233.0.3
  Ray head (GCS, client)   ray start --address      ray start --address
  egress: htb, a class per peer (its link rate), netem delay under each
```

Each node's Ray processes live in its namespaces and reach the others only over the veths, so
every byte between nodes crosses a shaped link. A node is a machine as UCX sees one: besides
its network namespace it has PID, IPC and mount namespaces of its own (and its own
``/tmp/ray``), so UCX's shared-memory transports (``sysv``, ``posix``, ``cma``), which it
offers only to peers in its own PID / IPC namespace, connect the replicas of one node, while
peers on other nodes get tcp on the node's veth (``UCX_TLS=tcp,sm,self``). Without those
namespaces every pair would look local to UCX (one boot id) and skip the shaped links. A
development and test harness (needs root, iproute2 and util-linux's ``unshare``), not a
deployment tool: ``deploy/`` covers real clusters.

``down`` kills every process in the harness's namespaces (found by namespace, so a crashed
``up`` leaves nothing it cannot clean), deletes the namespaces (their veths go with them) and
the bridge; it is idempotent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from graphflow.harness import cluster_ray
from graphflow.harness.cluster_ray import CLIENT_PORT, GCS_PORT, RAY_TEMP_DIR, STATE_DIR
from graphflow.harness.netns import run_checked
from graphflow.runtime.cluster import HEAD_ENV, ensure_token
from graphflow.runtime.errors import Unavailable

__all__ = [
    "BRIDGE",
    "ClusterNode",
    "ClusterSpec",
    "NamespaceCluster",
    "Removed",
    "cluster_down",
    "cluster_up",
    "parse_links",
    "running_cluster",
    "start_node",
    "stop_node",
]

BRIDGE = "gfc-br0"
NS_PREFIX = "gfc-node-"
SUBNET = "10.233.0"
BRIDGE_ADDRESS = f"{SUBNET}.254"
_UNSHAPED = "10gbit"  # the htb class of a pair nobody shaped (the veth itself is far faster)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """``nodes`` namespaces; ``link`` the rate of every pair not named in ``pair_links``
    (``""``: unshaped), ``pair_links`` rates per unordered node pair, ``delay_ms`` one-way
    delay added on every node's egress, ``cpus`` Ray CPUs per node."""

    nodes: int
    link: str = ""
    pair_links: Mapping[tuple[int, int], str] = field(default_factory=dict)
    delay_ms: float = 0.0
    cpus: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 16:
            raise ValueError(f"a namespace cluster has 1 to 16 nodes, got {self.nodes}")
        if self.delay_ms < 0 or self.cpus < 0:
            raise ValueError("delay and cpus must be non-negative")
        for a, b in self.pair_links:
            if a == b or not (0 <= a < self.nodes and 0 <= b < self.nodes):
                raise ValueError(f"link {a}-{b} does not name two of nodes 0..{self.nodes - 1}")
        for rate in (self.link, *self.pair_links.values()):
            if rate:
                _rate_bits(rate)

    def rate(self, a: int, b: int) -> str:
        """The shaped rate between nodes ``a`` and ``b`` (``""``: unshaped)."""
        return self.pair_links.get((min(a, b), max(a, b)), self.link)


@dataclass(frozen=True, slots=True)
class ClusterNode:
    index: int
    namespace: str
    device: str  # the veth inside the namespace
    address: str

    @classmethod
    def of(cls, i: int) -> ClusterNode:
        return cls(i, f"{NS_PREFIX}{i}", f"gfc{i}", f"{SUBNET}.{i + 1}")

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]

    def env(self) -> dict[str, str]:
        """What every process of this node runs with (Ray's workers inherit it from the raylet);
        node 0 (the head) also what ``HEAD_ENV`` sets."""
        return {
            "RAY_AUTH_MODE": "token",
            "UCX_TLS": "tcp,sm,self",  # sm reaches only this node's processes (its PID / IPC namespaces)
            "UCX_NET_DEVICES": self.device,
            "GRAPHFLOW_UCX_NET_DEVICES": self.device,
            "UCX_WARN_UNUSED_ENV_VARS": "n",
            **(HEAD_ENV if self.index == 0 else {}),
        }


@dataclass(frozen=True, slots=True)
class NamespaceCluster:
    """A running namespace cluster, as ``up`` left it (also kept in ``STATE_DIR/state.json``)."""

    spec: ClusterSpec
    nodes: tuple[ClusterNode, ...]
    head_address: str  # GCS, reachable from the root namespace over the bridge
    client_address: str  # ray://, for graphflow serve / submit / status from the root namespace

    def to_json(self) -> dict[str, object]:
        spec = asdict(self.spec)
        spec["pair_links"] = {f"{a}-{b}": r for (a, b), r in self.spec.pair_links.items()}
        return {
            "spec": spec,
            "nodes": [asdict(n) for n in self.nodes],
            "head_address": self.head_address,
            "client_address": self.client_address,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> NamespaceCluster:
        """The cluster as ``to_json`` wrote it."""
        spec = dict(obj["spec"])
        pairs: dict[tuple[int, int], str] = {}
        for k, rate in spec.pop("pair_links", {}).items():
            a, b = (int(x) for x in k.split("-"))
            pairs[(a, b)] = rate
        nodes = tuple(ClusterNode(**n) for n in obj["nodes"])
        return cls(ClusterSpec(**spec, pair_links=pairs), nodes, str(obj["head_address"]), str(obj["client_address"]))


@dataclass(frozen=True, slots=True)
class Removed:
    """What ``cluster_down`` removed."""

    namespaces: int
    processes: int  # killed, Ray's and every other process in the namespaces
    bridges: int


def parse_links(text: str) -> tuple[str, dict[tuple[int, int], str]]:
    """``1gbit`` (every pair) or ``0-1=10gbit,0-2=200mbit[,default]`` → (default, per pair)."""
    default, pairs = "", {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            default = part
            continue
        key, rate = part.split("=", 1)
        try:
            a, b = (int(x) for x in key.split("-"))
        except ValueError:
            raise ValueError(f"a link is NODE-NODE=RATE (e.g. 0-2=200mbit), got {part!r}") from None
        pairs[(min(a, b), max(a, b))] = rate
    return default, pairs


def _rate_bits(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for unit, scale in units.items():
        if rate.lower().endswith(unit):
            try:
                value = float(rate[: -len(unit)])
            except ValueError:
                break
            if value > 0:
                return value * scale
    raise ValueError(f"a link rate is a positive number with kbit, mbit or gbit (e.g. 1gbit), got {rate!r}")


def _check_tools() -> None:
    if os.geteuid() != 0:
        raise Unavailable("a namespace cluster needs root (network namespaces, veths, tc)")
    if not shutil.which("ip") or not shutil.which("tc"):
        raise Unavailable("iproute2 (ip, tc) is not installed; apt-get install iproute2")
    if not shutil.which("unshare"):
        raise Unavailable("util-linux's unshare is not installed; apt-get install util-linux")


def cluster_up(spec: ClusterSpec, say: object = None, start_ray: bool = True) -> NamespaceCluster:
    """Create the namespaces, bridge and shaped links, then start a Ray node in each (with
    ``start_ray=False`` the network only: Ray is then started by hand, e.g. by a Slurm script
    whose ``srun`` runs commands in the nodes' namespaces; ``down`` still stops it all).

    Anything left from an earlier run is removed first. On any failure everything started so
    far is torn down and the error names the step."""
    _check_tools()
    cluster_down()
    nodes = tuple(ClusterNode.of(i) for i in range(spec.nodes))
    log = say if callable(say) else (lambda _msg: None)
    try:
        _network(spec, nodes)
        log(f"network up: {spec.nodes} namespaces on {BRIDGE}")
        head = f"{nodes[0].address}:{GCS_PORT}"
        if start_ray:
            ensure_token()
        for node in nodes if start_ray else ():
            cluster_ray.start_ray(node, spec.cpus, head)
            log(f"ray node {node.index} started in {node.namespace}")
        if start_ray:
            cluster_ray.wait_nodes(nodes[0], head, spec.nodes)
    except BaseException:
        cluster_down()
        raise
    cluster = NamespaceCluster(spec, nodes, head, f"ray://{nodes[0].address}:{CLIENT_PORT}")
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    (STATE_DIR / "state.json").write_text(json.dumps(cluster.to_json(), indent=2))
    return cluster


def _network(spec: ClusterSpec, nodes: tuple[ClusterNode, ...]) -> None:
    run_checked("ip", "link", "add", BRIDGE, "type", "bridge")
    run_checked("ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
    run_checked("ip", "link", "set", BRIDGE, "up")
    for node in nodes:
        host_end = f"{node.device}h"
        run_checked("ip", "netns", "add", node.namespace)
        run_checked("ip", "link", "add", host_end, "type", "veth", "peer", "name", node.device, "netns", node.namespace)
        run_checked("ip", "link", "set", host_end, "master", BRIDGE, "up")
        ns = ["ip", "-n", node.namespace]
        run_checked(*ns, "addr", "add", f"{node.address}/24", "dev", node.device)
        run_checked(*ns, "link", "set", node.device, "up")
        run_checked(*ns, "link", "set", "lo", "up")
        _shape(spec, node, nodes)


def _shape(spec: ClusterSpec, node: ClusterNode, nodes: tuple[ClusterNode, ...]) -> None:
    """Egress of ``node``: an htb class per peer at the pair's rate (a pair's two directions are
    both shaped, each on its sender), netem delay under each class; default class unshaped."""
    peers = [p for p in nodes if p.index != node.index and spec.rate(node.index, p.index)]
    if not peers and not spec.delay_ms:
        return
    tc = [*node.exec_prefix(), "tc"]
    dev = ["dev", node.device]
    run_checked(*tc, "qdisc", "add", *dev, "root", "handle", "1:", "htb", "default", "99")
    classes = [(99, _UNSHAPED, None), *((10 + p.index, spec.rate(node.index, p.index), p) for p in peers)]
    for minor, rate, peer in classes:
        burst = str(max(32 * 1024, int(_rate_bits(rate) / 8 / 250)))  # ≥ 4 ms worth of bytes
        run_checked(
            *tc, "class", "add", *dev, "parent", "1:", "classid", f"1:{minor}", "htb", "rate", rate, "burst", burst
        )
        if spec.delay_ms:
            run_checked(*tc, "qdisc", "add", *dev, "parent", f"1:{minor}", "netem", "delay", f"{spec.delay_ms}ms")
        if peer is not None:
            run_checked(
                *tc,
                "filter",
                "add",
                *dev,
                "protocol",
                "ip",
                "parent",
                "1:",
                "prio",
                "1",
                "u32",
                "match",
                "ip",
                "dst",
                f"{peer.address}/32",
                "flowid",
                f"1:{minor}",
            )


def harness_namespaces() -> list[str]:
    """Namespaces this harness created (by name), from this run or an earlier one."""
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return sorted(line.split()[0] for line in proc.stdout.splitlines() if line.startswith(NS_PREFIX))


def cluster_down() -> Removed:
    """Stop every process in the harness's namespaces, delete them and the bridge. Idempotent;
    returns what it removed."""
    namespaces = harness_namespaces() if shutil.which("ip") else []
    killed = _kill_namespaces(namespaces)
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    for link in _host_veths():  # NOTE: a namespace's veth can outlive it briefly; delete the host end
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    bridge = subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True).returncode == 0
    (STATE_DIR / "state.json").unlink(missing_ok=True)
    _forget_head_address()
    shutil.rmtree(RAY_TEMP_DIR, ignore_errors=True)  # the head's session (logs, sockets)
    shutil.rmtree(STATE_DIR / "nodes", ignore_errors=True)  # every node's /tmp/ray
    return Removed(len(namespaces), killed, int(bridge))


def _forget_head_address() -> None:
    """Remove a ``ray_current_cluster`` record that names this harness's head (left by a run
    before heads got their own temp dir), so an embedded ``ray.init()`` starts its own Ray."""
    for folder in (Path("/tmp/ray"), RAY_TEMP_DIR):
        record = folder / "ray_current_cluster"
        if record.exists() and record.read_text().strip().startswith(f"{SUBNET}."):
            record.unlink(missing_ok=True)


def _host_veths() -> list[str]:
    """Root-namespace ends of the harness's veths (``gfc<i>h``)."""
    proc = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True)
    names = [line.split(":")[1].strip().split("@")[0] for line in proc.stdout.splitlines() if line.count(":") >= 2]
    return [n for n in names if n.startswith("gfc") and n.endswith("h")]


def _namespace_pids(ns: str) -> list[int]:
    proc = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in proc.stdout.split() if p.isdigit() and int(p) != os.getpid()]


def _kill_namespaces(namespaces: list[str], grace_s: float = 5.0) -> int:
    """SIGTERM every process in ``namespaces``, SIGKILL what is left after ``grace_s``; returns
    how many there were."""

    def pids() -> list[int]:
        return [p for ns in namespaces for p in _namespace_pids(ns)]

    first = pids()
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        for pid in pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pids() and time.monotonic() < deadline:
            time.sleep(0.1)
    return len(first)


def stop_node(index: int) -> int:
    """Kill node ``index`` (its raylet and every process in its namespace), leaving its
    network in place, as a machine that crashed; returns the processes killed."""
    if index == 0:
        raise ValueError("node 0 holds the Ray head; stop a worker node (1 or more) or take the cluster down")
    ns = ClusterNode.of(index).namespace
    if ns not in harness_namespaces():
        raise ValueError(f"no node {index} in the namespace cluster (start one with `graphflow cluster up`)")
    return _kill_namespaces([ns])


def start_node(index: int) -> None:
    """Start node ``index``'s Ray worker again (after :func:`stop_node`)."""
    state = running_cluster()
    if state is None:
        raise ValueError("no namespace cluster is running; start one with `graphflow cluster up`")
    if not 0 < index < state.spec.nodes:
        raise ValueError(f"node {index} is not a worker node of this {state.spec.nodes}-node cluster")
    node = ClusterNode.of(index)
    if _namespace_pids(node.namespace):
        raise ValueError(f"node {index} is running; stop it first")
    cluster_ray.start_ray(node, state.spec.cpus, state.head_address)


def running_cluster() -> NamespaceCluster | None:
    """The cluster ``up`` recorded, when its namespaces still exist."""
    path = STATE_DIR / "state.json"
    if not path.exists() or not harness_namespaces():
        return None
    return NamespaceCluster.from_json(json.loads(path.read_text()))
