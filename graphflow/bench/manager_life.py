"""``graphflow bench manager-life``: what a KV-state manager holds, and what a snapshot costs it,
as a deployment serves node after node.

Nodes arrive the way a served executor reports them: runs of ``nodes_per_run`` nodes, each
node one admit event of a ``blocks_per_node``-block chain on one of two replicas (random keys,
as in ``graphflow bench catalog``), each replica evicting its oldest state once it holds
``states_per_replica``, and the executor ending each run after its last node
(``KVStateManager.end_run``, which forgets a run's records ``retain_ended_s`` later; one node
per second of the manager's clock). The same stream runs a second time without ending runs, the
manager before ``end_run`` existed, as the reference. At each checkpoint: catalog rows (evicted
copies included), state records kept, and the median wall time of three snapshots (the manager
answers nothing while it writes one).
"""

from __future__ import annotations

import tempfile
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from graphflow.bench.catalog import admit_event
from graphflow.kv.manager import RETAIN_ENDED_S, EvictEvent, KVStateManager, ReplicaInfo

__all__ = ["ManagerLifeRow", "bench_manager_life"]

REPLICAS = ("r0", "r1")


@dataclass(frozen=True, slots=True)
class ManagerLifeRow:
    runs_ended: bool
    nodes: int
    catalog_rows: int
    live_blocks: int
    states_kept: int
    snapshot_s: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def bench_manager_life(
    checkpoints: Sequence[int] = (2_000, 10_000, 30_000),
    nodes_per_run: int = 5,
    blocks_per_node: int = 19,
    states_per_replica: int = 70,
    retain_ended_s: float = RETAIN_ENDED_S,
    seed: int = 0,
    say: Callable[[str], None] = lambda _m: None,
) -> list[ManagerLifeRow]:
    """Rows for each checkpoint, first with runs ended, then without (same stream, same seed)."""
    if not checkpoints or list(checkpoints) != sorted(set(checkpoints)) or checkpoints[0] <= 0:
        raise ValueError(f"checkpoints must be increasing positive node counts, got {list(checkpoints)}")
    if min(nodes_per_run, blocks_per_node, states_per_replica) <= 0:
        raise ValueError("nodes_per_run, blocks_per_node and states_per_replica must be positive")
    rows = []
    for runs_ended in (True, False):
        say(f"{checkpoints[-1]:,} nodes, runs {'ended' if runs_ended else 'never ended'}")
        rows += _life(checkpoints, nodes_per_run, blocks_per_node, states_per_replica, retain_ended_s, seed, runs_ended)
    return rows


def _life(
    checkpoints: Sequence[int],
    nodes_per_run: int,
    blocks_per_node: int,
    states_per_replica: int,
    retain_ended_s: float,
    seed: int,
    runs_ended: bool,
) -> list[ManagerLifeRow]:
    rng = np.random.default_rng(seed)
    mgr = KVStateManager(block_tokens=16, retain_ended_s=retain_ended_s)
    for r in REPLICAS:
        mgr.add_replica(ReplicaInfo(r, budget_bytes=1 << 40))
    held: dict[str, deque[tuple[str, tuple[int, ...]]]] = {r: deque() for r in REPLICAS}
    rows, node = [], 0
    for checkpoint in checkpoints:
        while node < checkpoint:
            run, step = divmod(node, nodes_per_run)
            replica = REPLICAS[node % len(REPLICAS)]
            keys = rng.integers(1, np.iinfo(np.int64).max, size=blocks_per_node, dtype=np.int64).astype(np.uint64)
            ev = admit_event(f"run-{run}:n{step}", keys, replica, 16)
            mgr.apply([ev], float(node))
            held[replica].append((ev.record.state.state_id, ev.record.state.block_keys))
            if len(held[replica]) > states_per_replica:
                sid, old = held[replica].popleft()
                mgr.apply([EvictEvent(replica, old, sid)], float(node))
            node += 1
            if runs_ended and step == nodes_per_run - 1:
                mgr.end_run(f"run-{run}", float(node))
        held_now = mgr.summary()
        rows.append(
            ManagerLifeRow(
                runs_ended, node, held_now.catalog_rows, held_now.live_copies, held_now.records, _snapshot_s(mgr)
            )
        )
    return rows


def _snapshot_s(mgr: KVStateManager) -> float:
    """Median seconds of three snapshots into a fresh folder, as the manager times its own."""
    times = []
    with tempfile.TemporaryDirectory(prefix="graphflow-manager-life-") as tmp:
        for _ in range(3):
            mgr.snapshot(tmp)
            times.append(mgr.summary().snapshot_s)
    return float(np.median(times))
