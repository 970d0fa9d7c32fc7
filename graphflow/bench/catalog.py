"""``graphflow bench catalog``: register, look up, snapshot and restore a million-block catalog.

Blocks arrive the way replicas report them: one admit event per state, each a chain of
``blocks_per_state`` blocks. Keys are random 64-bit values (hash-chain keys are
indistinguishable from random; computing 10^6 xxh64 chains would time the hash, not the
catalog). Lookups are ``locate(key)`` of random admitted keys, timed one by one.
"""

from __future__ import annotations

import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from graphflow.kv.catalog import BlockBatch
from graphflow.kv.manager import AdmitEvent, KVStateManager, ReplicaInfo, StateRecord
from graphflow.kv.state import KVState, Lineage, Placement, Positions, RopeInfo

__all__ = ["CatalogBench", "admit_event", "bench_catalog"]


@dataclass(frozen=True, slots=True)
class CatalogBench:
    blocks: int
    register_blocks_per_s: float
    lookup_p50_us: float
    lookup_p99_us: float
    prefix_lookup_p50_us: float
    snapshot_s: float
    restore_s: float
    bytes_per_block: float
    state_bytes_per_block: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def admit_event(state_id: str, keys: np.ndarray, replica: str, block_tokens: int) -> AdmitEvent:
    """What a replica reports for a state of ``keys`` (a chain from the root), tokens included."""
    n = len(keys)
    parents = np.concatenate((np.zeros(1, dtype=np.uint64), keys[:-1]))
    batch = BlockBatch(
        replica=replica,
        state=state_id,
        key=keys,
        parent_key=parents,
        position_offset=np.arange(n, dtype=np.int32) * block_tokens,
        num_tokens=np.full(n, block_tokens, dtype=np.int16),
        nbytes=np.full(n, 196608, dtype=np.int32),
        checksum=keys ^ np.uint64(0x9E3779B97F4A7C15),
    )
    state = KVState(
        state_id,
        "bench",
        "0",
        tuple(keys.tolist()),
        Positions(0, n * block_tokens, RopeInfo(1e4)),
        Lineage("materialize"),
        Placement(replica),
    )
    tokens = np.arange(n * block_tokens, dtype="<i4").tobytes()
    return AdmitEvent(replica, StateRecord(state, tokens), batch)


def bench_catalog(
    blocks: int = 1_000_000,
    blocks_per_state: int = 1024,
    lookups: int = 20_000,
    seed: int = 0,
    say: Callable[[str], None] = lambda _m: None,
) -> CatalogBench:
    for name, value in (("--blocks", blocks), ("--blocks-per-state", blocks_per_state), ("lookups", lookups)):
        if value <= 0:
            raise ValueError(f"{name} must be 1 or more, got {value}")
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(1, np.iinfo(np.int64).max, size=int(blocks * 1.01), dtype=np.int64)).astype(np.uint64)
    keys = rng.permutation(keys)[:blocks]
    replicas = [f"r{i}" for i in range(4)]
    events = [
        admit_event(f"s{i}", keys[lo : lo + blocks_per_state], replicas[i % 4], 16)
        for i, lo in enumerate(range(0, blocks, blocks_per_state))
    ]
    say(f"registering {blocks:,} blocks in {len(events)} admit events")
    mgr = _manager(replicas)
    start = time.perf_counter()
    for ev in events:
        mgr.apply([ev], now_s=1.0)
    register_s = time.perf_counter() - start
    catalog_bytes = mgr.catalog.nbytes_in_memory()
    state_bytes = _state_bytes_per_block(replicas, events[: max(1, len(events) // 10)])

    say("timing lookups")
    sample = rng.choice(keys, size=lookups).tolist()
    lat = np.empty(lookups, dtype=np.float64)
    for i, k in enumerate(sample):
        t0 = time.perf_counter_ns()
        mgr.locate(k)
        lat[i] = time.perf_counter_ns() - t0
    chains = [events[j].blocks.key[:64].tolist() for j in rng.integers(0, len(events), size=200)]
    plat = np.empty(len(chains), dtype=np.float64)
    for i, chain in enumerate(chains):
        t0 = time.perf_counter_ns()
        mgr.longest_prefix(chain)
        plat[i] = time.perf_counter_ns() - t0

    with tempfile.TemporaryDirectory(prefix="graphflow-catalog-") as tmp:
        say("snapshot and restore")
        s0 = time.perf_counter()
        mgr.snapshot(tmp)
        snapshot_s = time.perf_counter() - s0
        s0 = time.perf_counter()
        back = KVStateManager.restore(tmp)
        restore_s = time.perf_counter() - s0
        probe = int(sample[0])
        if back.locate(probe) != mgr.locate(probe):
            raise RuntimeError("restored catalog answers differently")
    return CatalogBench(
        blocks=blocks,
        register_blocks_per_s=blocks / register_s,
        lookup_p50_us=float(np.percentile(lat, 50) / 1e3),
        lookup_p99_us=float(np.percentile(lat, 99) / 1e3),
        prefix_lookup_p50_us=float(np.percentile(plat, 50) / 1e3),
        snapshot_s=snapshot_s,
        restore_s=restore_s,
        bytes_per_block=catalog_bytes / blocks,
        state_bytes_per_block=state_bytes,
    )


def _manager(replicas: list[str]) -> KVStateManager:
    mgr = KVStateManager(block_tokens=16)
    for r in replicas:
        mgr.add_replica(ReplicaInfo(r, budget_bytes=1 << 40))
    return mgr


def _state_bytes_per_block(replicas: list[str], events: list[AdmitEvent]) -> float:
    """Traced Python memory of the state records per block, on a sample (tracing is slow)."""
    tracemalloc.start()
    try:
        mgr = _manager(replicas)
        before = tracemalloc.get_traced_memory()[0]
        for ev in events:
            mgr.apply([ev], now_s=1.0)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    n = sum(len(ev.blocks) for ev in events)
    return max(0.0, grown - mgr.catalog.nbytes_in_memory()) / n
