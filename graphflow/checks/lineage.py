"""Lineage check: evict states under a tight budget, request them again, rebuild from lineage.

```
materialize S states ─► over budget ─► manager.plan_eviction ─► evict (lineage kept)
request every state ─► manager.recovery_plan ─► reuse what is left, recompute the rest
                    ─► compare rebuilt blocks with the checksums the catalog recorded
```
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from graphflow.kv.manager import KVStateManager, ReplicaInfo
from graphflow.kv.operators import evict, materialize
from graphflow.kv.packing import cache_to_blocks
from graphflow.kv.state import Placement
from graphflow.kv.store import BlockStore
from graphflow.models.engine import Engine
from graphflow.models.prompts import prompt_token_ids

__all__ = ["LineageCheck", "run_lineage_check"]


@dataclass(frozen=True, slots=True)
class LineageCheck:
    model: str
    states: int
    tokens_per_state: int
    budget_bytes: int
    evicted: int
    rebuilt: int
    recomputed_tokens: int
    rebuilt_bit_identical: bool

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def run_lineage_check(
    model: str = "tiny-llama", states: int = 6, tokens: int = 256, say: Callable[[str], None] = lambda _m: None
) -> LineageCheck:
    engine = Engine.load(model, say=say)
    per_state = tokens * engine.kv_bytes_per_token()
    budget = 2 * per_state  # room for two states: the rest must be evicted
    store = BlockStore(engine.identity, capacity_bytes=budget, placement=Placement("replica-0"))
    manager = KVStateManager(block_tokens=store.block_tokens)
    manager.add_replica(ReplicaInfo("replica-0", budget_bytes=budget))
    prompts = {
        f"agent-{i}": engine.tokenizer.encode(f"Agent {i} notes: ") + prompt_token_ids(engine.tokenizer, tokens)
        for i in range(states)
    }
    prompts = {k: v[:tokens] for k, v in prompts.items()}
    evicted: list[str] = []
    for step, (sid, ids) in enumerate(prompts.items()):
        while not store.can_allocate(per_state):
            eviction = manager.plan_eviction("replica-0", now_s=float(step), budget_bytes=budget - per_state)
            victims = [v for v in manager.states_owning(eviction.keys, "replica-0") if v not in evicted]
            if not victims:
                raise RuntimeError(f"nothing evictable on replica-0 (shortfall {eviction.shortfall_bytes} bytes)")
            for victim in victims:
                say(f"evicting {victim}")
                evict(store, victim, manager=manager)
                evicted.append(victim)
        say(f"materializing {sid}")
        if materialize(engine, store, ids, state_id=sid, manager=manager, now_s=float(step)) is None:
            raise RuntimeError(f"{sid} does not fit even in an empty store of {budget} bytes")
        manager.check_integrity()
        store.check_integrity()
    rebuilt, identical, recomputed = 0, True, 0
    for sid in evicted:
        plan = manager.recovery_plan(sid, "replica-0")
        record = manager.state(sid)
        ids = record.token_ids
        recomputed += plan.recompute_tokens
        say(f"rebuilding {sid} from lineage: {[s.action for s in plan.steps]}")
        blocks = cache_to_blocks(engine.prefill(ids).cache, ids, engine.identity, store.block_tokens)
        recorded = _recorded_checksums(manager, record.state.block_keys)
        identical &= [b.key for b in blocks] == list(record.state.block_keys)
        identical &= [b.checksum for b in blocks] == recorded
        rebuilt += 1
    return LineageCheck(model, states, tokens, budget, len(evicted), rebuilt, recomputed, bool(identical))


def _recorded_checksums(manager: KVStateManager, keys: tuple[int, ...]) -> list[int]:
    """Checksums the catalog recorded when the blocks were first admitted (rows survive eviction)."""
    col_keys, col_sums = manager.catalog.col("key"), manager.catalog.col("checksum")
    out = []
    for k in keys:
        rows = np.flatnonzero(col_keys == np.uint64(k))
        out.append(int(col_sums[rows[0]]) if len(rows) else -1)
    return out
