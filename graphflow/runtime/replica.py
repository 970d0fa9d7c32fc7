"""A model replica as a plain class: engine + block store + transport endpoint.

``graphflow.runtime.actors`` wraps it in a Ray actor; tests drive it directly. A node run:

```
tokens ─► longest local prefix (hash-chain keys in the store)            REUSE
       ─► (optional) receive missing leading blocks from a peer replica   TRANSFER
       ─► rebuild the cache from those blocks, prefill the rest           RECOMPUTE part
          (differential/stateless modes: the node's template KV from base + residual,
           runtime.templates, only its last token prefilled                RECONSTRUCT)
       ─► greedy decode ─► pack the whole state, store it (shared blocks are not copied)
       ─► report admits for the manager and a per-node trace
```
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from graphflow.kv.block import chain_keys
from graphflow.kv.codec import from_wire, to_wire
from graphflow.kv.differential import ResidualCodec
from graphflow.kv.diffstore import KVMode
from graphflow.kv.errors import ChecksumMismatch, MissingBlocks
from graphflow.kv.manager import AdmitEvent, EvictEvent, ReplicaInfo, StateRecord, batch_from_blocks
from graphflow.kv.packing import blocks_to_cache, cache_to_blocks
from graphflow.kv.paths import PathKey
from graphflow.kv.state import Lineage, Placement
from graphflow.kv.store import BlockStore
from graphflow.models.engine import Engine
from graphflow.runtime.templates import TemplateKV, kv_mode
from transport.base import TransferSpec, Transport, TransportConfig

__all__ = ["NodeResult", "NodeRun", "ReplicaConfig", "ReplicaWorker"]


def _templates(engine: Engine, config: ReplicaConfig) -> TemplateKV | None:
    mode = kv_mode(config.kv_mode)
    if mode is KVMode.EXACT:
        return None
    codec = ResidualCodec(recompute_head=config.recompute_head)
    return TemplateKV(engine, mode, codec, config.residual_refs, config.hot_min_count)


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    name: str
    model: str = "tiny-llama"
    capacity_bytes: int = 1 << 30
    block_tokens: int = 16
    device: str = "cpu"
    transport: str = "ray"
    timeout_s: float = 120.0
    kv_mode: str = "exact"  # exact | differential | stateless (runtime.templates)
    recompute_head: int = 12  # differential: template tokens recomputed, not rebuilt
    residual_refs: int = 4  # differential: exact executions averaged into a path's residual
    hot_min_count: int = 2  # differential: executions that make a path hot (others are pruned)


@dataclass(frozen=True, slots=True)
class NodeRun:
    """What the executor asks a replica to do for one node."""

    state_id: str
    tokens: tuple[int, ...]
    decode_steps: int
    reuse: bool = True
    transfer_from: str = ""  # peer transport address; "" = no transfer
    transfer_tokens: int = 0  # leading tokens whose blocks the peer sends
    transfer_id: int = 0
    parents: tuple[str, ...] = ()
    op: str = ""  # the node's operation (role); with template_tokens, enables template rebuilds
    path: tuple[str, ...] = ()  # roles whose outputs precede the template (its path key)
    template_tokens: int = 0  # the context's last tokens that are the operation's template


@dataclass(frozen=True, slots=True)
class NodeResult:
    state_id: str
    replica: str
    output_ids: tuple[int, ...]
    text: str
    reused_tokens: int
    transferred_tokens: int
    prefill_tokens: int
    bytes_moved: int
    ttft_s: float
    total_s: float
    admit: AdmitEvent | None = field(default=None, compare=False)  # None: not kept (reuse off, no room)
    evicted: tuple[EvictEvent, ...] = field(default=(), compare=False)  # states dropped to make room
    rebuilt_tokens: int = 0  # template tokens not prefilled in order (base + residual; counts a recomputed head)


class ReplicaWorker:
    def __init__(self, config: ReplicaConfig) -> None:
        from transport.registry import create

        self.config = config
        self.engine = Engine.load(config.model, device=config.device)
        self.store = BlockStore(
            self.engine.identity,
            config.capacity_bytes,
            config.block_tokens,
            Placement(config.name, device=config.device),
        )
        self._faults: list[str] = []
        self._lock = threading.RLock()  # store mutations (a replica runs several calls at once)
        self._age: OrderedDict[str, None] = OrderedDict()  # kept states, oldest first
        kwargs: dict[str, Any] = {"name": f"replica:{config.name}"} if config.transport in ("ray", "local") else {}
        self.transport: Transport = create(config.transport, TransportConfig(timeout_s=config.timeout_s), **kwargs)
        self.templates = _templates(self.engine, config)

    # ---- identity ------------------------------------------------------------------------
    def address(self) -> str:
        return self.transport.address

    def model_key(self) -> str:
        return self.engine.identity.model_key

    def encode(self, text: str) -> list[int]:
        return self.engine.tokenizer.encode(text)

    def decode_text(self, ids: Sequence[int]) -> str:
        return self.engine.tokenizer.decode(list(ids))

    # ---- node execution ------------------------------------------------------------------
    def run_node(self, run: NodeRun) -> NodeResult:
        """Execute one node; see the module docstring. Raises ``ValueError`` on a bad request."""
        if not run.tokens:
            raise ValueError("a node needs at least one context token")
        if not 0 <= run.template_tokens <= len(run.tokens):
            raise ValueError(f"template_tokens must lie in [0, {len(run.tokens)}] (the context's length), "
                             f"got {run.template_tokens}")  # fmt: skip
        self._check_length(len(run.tokens) + run.decode_steps)
        start = time.perf_counter()
        ids = list(run.tokens)
        bt = self.config.block_tokens
        moved = 0
        transferred = 0
        evicted: list[EvictEvent] = []
        if run.transfer_from and run.transfer_tokens > 0:
            moved, transferred, evicted = self._receive(run, ids[: run.transfer_tokens])
        prefix_blocks, dropped = self._local_prefix(ids) if (run.reuse or transferred) else ([], [])
        evicted += dropped
        reused = len(prefix_blocks) * bt
        # NOTE: _local_prefix verified every block's checksum just now
        cache = (blocks_to_cache(prefix_blocks, self.engine.identity, self.engine.config, verify_bytes=False)
                 if prefix_blocks else None)  # fmt: skip
        pre, rebuilt = self._prefill(run, ids, reused, cache)
        first = int(torch.argmax(pre.logits))
        ttft = time.perf_counter() - start
        out = self.engine.decode_greedy(pre.cache, first, run.decode_steps - 1) if run.decode_steps > 1 else None
        output = [first, *(out.token_ids if out else ())]
        # a rebuilt template is approximate: never offer it to later nodes as an exact prefix
        keep = run.reuse and not rebuilt
        admit, more = self._keep(run, ids + output[:-1], pre.cache) if keep else (None, [])
        evicted += more
        return NodeResult(
            state_id=run.state_id,
            replica=self.config.name,
            output_ids=tuple(output),
            text=self.decode_text(output),
            reused_tokens=max(0, reused - transferred),
            transferred_tokens=transferred,
            prefill_tokens=len(ids) - reused - rebuilt,
            bytes_moved=moved,
            ttft_s=ttft,
            total_s=time.perf_counter() - start,
            admit=admit,
            evicted=tuple(evicted),
            rebuilt_tokens=rebuilt,
        )

    def _prefill(self, run: NodeRun, ids: list[int], reused: int, cache: Any) -> tuple[Any, int]:
        """Prefill ``ids[reused:]`` on ``cache``; in a differential or stateless mode, the node's
        template is rebuilt from base (+ residual) where it can be. Returns (prefill, rebuilt tokens)."""
        n = run.template_tokens
        start = len(ids) - n
        if self.templates is None or not run.op or n < 2 or start <= 0 or reused > start:
            return self.engine.prefill(ids[reused:], cache), 0
        key, template = PathKey(run.path, run.op), ids[start:]
        with self._lock:  # NOTE: a replica runs several nodes at once; the template store is shared
            self.templates.prepare(key, template)
        prefix = self.engine.prefill(ids[reused:start], cache).cache if start > reused else cache
        rebuilt = self.templates.rebuild(prefix, start, key, template)
        if rebuilt is not None:
            return self.engine.prefill(ids[-1:], rebuilt), n - 1
        pre = self.engine.prefill(template, prefix)
        with self._lock:
            self.templates.learn(key, pre.cache, start, n)
        return pre, 0

    def materialize(self, state_id: str, tokens: Sequence[int]) -> list[AdmitEvent | EvictEvent]:
        """Prefill ``tokens`` once and store them as ``state_id`` (the task context root).

        Returns the events for the manager: states evicted to make room, then the admit (none
        when the state is larger than the whole store)."""
        ids = list(tokens)
        self._check_length(len(ids))
        blocks = cache_to_blocks(self.engine.prefill(ids).cache, ids, self.engine.identity, self.config.block_tokens)
        admit, evicted = self._store_state(blocks, Lineage("materialize"), state_id, ids)
        return [*evicted, *([admit] if admit else [])]

    def prefill_seconds(self, lengths: Sequence[int], repeats: int = 2) -> list[tuple[int, float]]:
        """Measured prefill times (median of ``repeats`` after a warm-up) for calibration."""
        from graphflow.models.prompts import prompt_token_ids

        out = []
        for n in lengths:
            ids = prompt_token_ids(self.engine.tokenizer, n)
            self.engine.prefill(ids)
            times = sorted(self.engine.prefill(ids).seconds for _ in range(repeats))
            out.append((n, times[len(times) // 2]))
        return out

    def max_positions(self) -> int:
        """The longest context this replica's model accepts (0: no stated limit)."""
        return int(getattr(self.engine.config, "max_position_embeddings", 0) or 0)

    def _check_length(self, n: int) -> None:
        limit = self.max_positions()
        if limit and n > limit:
            raise ValueError(f"the context needs {n} positions but {self.config.model} accepts at most {limit}; "
                             "shorten the task or its workflow's outputs")  # fmt: skip

    def kv_bytes_per_token(self) -> int:
        return self.engine.kv_bytes_per_token()

    def _keep(self, run: NodeRun, state_tokens: list[int], cache: Any) -> tuple[AdmitEvent | None, list[EvictEvent]]:
        """Store the node's whole state (KV for every token but the last output) for reuse."""
        computed = cache_to_blocks(cache, state_tokens, self.engine.identity, self.config.block_tokens)
        return self._store_state(computed, Lineage("node", run.parents), run.state_id, state_tokens)

    def _store_state(self, computed: list[Any], lineage: Lineage, state_id: str,
                     tokens: Sequence[int]) -> tuple[AdmitEvent | None, list[EvictEvent]]:  # fmt: skip
        """Add a state, evicting the oldest states first when the store is full.

        A state larger than the whole store is not kept (the node's output is still valid; the
        state will be recomputed when needed): the store never exceeds its budget.
        """
        with self._lock:
            evicted: list[EvictEvent] = []
            for b in computed:  # a stored copy that went corrupt is dropped, not shared
                if self.store.has_block(b.key):
                    try:
                        self.store.block(b.key).verify()
                    except ChecksumMismatch:
                        evicted += self._drop_block(b.key)
            while True:
                # NOTE: a block this store already holds keeps its stored bytes (first writer
                # wins, as in vLLM's prefix cache): the same tokens recomputed along another path
                # differ only by rounding, and one key never maps to two versions on a replica.
                blocks = [self.store.block(b.key) if self.store.has_block(b.key) else b for b in computed]
                new = [b for b in blocks if not self.store.has_block(b.key)]
                need = sum({b.key: b.nbytes for b in new}.values())
                if self.store.can_allocate(need) or not self._age:
                    break
                evicted.append(self._evict_oldest())
            state = self.store.add_state(blocks, lineage, state_id)  # None: larger than the whole store
            if state is None:
                return None, evicted
            self._age[state_id] = None
            return self._admit_event(state_id, tokens), evicted

    def _admit_event(self, state_id: str, tokens: Sequence[int]) -> AdmitEvent:
        """The admit for a stored state, listing every block of it, not only new ones: the manager
        must learn that this replica holds blocks it received or already had (it skips copies it
        knows)."""
        blocks = self.store.blocks(state_id)
        unique = list({b.key: b for b in blocks}.values())
        record = StateRecord.of(self.store.state(state_id), tokens)
        return AdmitEvent(self.config.name, record, batch_from_blocks(unique, self.config.name, state_id))

    def _evict_oldest(self) -> EvictEvent:
        return self._evict(next(iter(self._age)))

    def _evict(self, state_id: str) -> EvictEvent:
        del self._age[state_id]
        freed = tuple(k for k in self.store.state(state_id).block_keys if self.store.refcount(k) == 1)
        self.store.release(state_id)
        return EvictEvent(self.config.name, freed, state_id)

    def _local_prefix(self, ids: list[int]) -> tuple[list[Any], list[EvictEvent]]:
        """Leading full blocks of ``ids`` this store holds, leaving ≥ 1 token to prefill.

        Each block's checksum is verified before reuse; a corrupt block is never reused: the
        states holding it are dropped (reported as evictions) and its tokens are recomputed."""
        bt = self.config.block_tokens
        usable = (len(ids) - 1) // bt * bt
        keys = chain_keys(ids[:usable], self.engine.identity.model_key, bt)
        out: list[Any] = []
        with self._lock:
            for k in keys:
                if not self.store.has_block(k):
                    break
                block = self.store.block(k)
                try:
                    block.verify()
                except ChecksumMismatch:
                    return out, self._drop_block(k)
                out.append(block)
        return out, []

    def _drop_block(self, key: int) -> list[EvictEvent]:
        """Release every state holding ``key`` (a corrupt block); returns the evictions."""
        holders = [sid for sid in self._age if key in self.store.state(sid).block_keys]
        return [self._evict(sid) for sid in holders]

    def _receive(self, run: NodeRun, ids: list[int]) -> tuple[int, int, list[EvictEvent]]:
        from graphflow.checks.transfer import spec_for_prompt

        bt = self.config.block_tokens
        n = len(ids) // bt * bt
        spec = spec_for_prompt(self.engine.identity, ids[:n], bt, run.transfer_from, run.transfer_id)
        got = self.transport.recv(spec)
        received = from_wire(got.headers, got.tensors)
        # kept as a state of its own (aged out like any other); blocks this replica already
        # computed itself keep their stored bytes (see _store_state)
        _, evicted = self._store_state(received, Lineage("transfer"), f"{run.state_id}:transfer", ids[:n])
        return got.stats.nbytes, n, evicted

    FAULTS = ("drop-send", "corrupt-send", "corrupt-store")

    def inject_fault(self, fault: str) -> None:
        """Fault injection for ``graphflow check faults``: the next send misbehaves once.

        ``drop-send`` sends nothing (the receiver times out); ``corrupt-send`` flips one payload
        byte after the checksums were taken (the receiver's verification must catch it);
        ``corrupt-store`` flips one byte of every stored block now, in place (reuse must catch it).
        """
        if fault not in self.FAULTS:
            raise ValueError(f"unknown fault {fault!r}; choose one of {', '.join(self.FAULTS)}")
        if fault == "corrupt-store":
            with self._lock:
                seen: set[int] = set()
                for sid in self._age:
                    for b in self.store.blocks(sid):
                        if b.key not in seen:  # NOTE: flipping a shared block twice would heal it
                            seen.add(b.key)
                            b.tensor.view(torch.uint8).view(-1)[0] ^= 0xFF
            return
        self._faults.append(fault)

    def send_prefix(self, tokens: Sequence[int], n_tokens: int, peer: str, transfer_id: int) -> int:
        """Send the blocks of ``tokens[:n_tokens]`` (full blocks) to ``peer``; returns bytes."""
        bt = self.config.block_tokens
        n = n_tokens // bt * bt
        keys = chain_keys(list(tokens[:n]), self.engine.identity.model_key, bt)
        with self._lock:
            missing = [k for k in keys if not self.store.has_block(k)]
            if missing:
                raise MissingBlocks(
                    f"replica {self.config.name} no longer holds {len(missing)} of the blocks asked for"
                )
            blocks = [self.store.block(k) for k in keys]
        headers, tensors = to_wire(blocks)
        fault = self._faults.pop(0) if self._faults else ""
        if fault == "drop-send":
            return 0
        if fault == "corrupt-send":
            tensors = [t.clone() for t in tensors]
            tensors[0].view(torch.uint8).view(-1)[0] ^= 0xFF
        return self.transport.send(TransferSpec.for_headers(transfer_id, peer, headers), headers, tensors).nbytes

    def probe(self, peer: str, nbytes: int, transfer_id: int, send: bool) -> float:
        """One synthetic transfer of ``nbytes`` in blocks of this model's block size, to or
        from ``peer``; returns the receiver's measured seconds (0 on the sending side)."""
        from transport.probe import probe_blocks

        headers, tensors = probe_blocks(nbytes, self.engine.kv_bytes_per_token() * self.config.block_tokens)
        if send:
            self.transport.send(TransferSpec.for_headers(transfer_id, peer, headers), headers, tensors)
            return 0.0
        start = time.perf_counter()
        self.transport.recv(TransferSpec.for_headers(transfer_id, peer, headers))
        return time.perf_counter() - start

    def release(self, state_id: str) -> int:
        with self._lock:
            self._age.pop(state_id, None)
            return self.store.release(state_id)

    def info(self) -> ReplicaInfo:
        """How the manager registers this replica."""
        return ReplicaInfo(self.config.name, device=self.config.device, budget_bytes=self.config.capacity_bytes,
                           address=self.address())  # fmt: skip

    def holdings(self) -> list[AdmitEvent]:
        """Every state this replica holds, oldest first, as admits: a restarted manager
        re-learns the replica's contents from these."""
        with self._lock:
            return [self._admit_event(sid, [t for b in self.store.blocks(sid) for t in b.token_ids])
                    for sid in self._age]  # fmt: skip

    def stats(self) -> dict[str, Any]:
        s = self.store.stats()
        return {"replica": self.config.name, "model": self.config.model, "used_bytes": s.used_bytes,
                "capacity_bytes": s.capacity_bytes, "blocks": s.num_blocks, "states": s.num_states,
                "peak_bytes": s.peak_used_bytes,
                **(self.templates.stats_dict() if self.templates else {"kv_mode": "exact"})}  # fmt: skip
