"""Agents fanning out from shared root contexts on two replicas: time, KV memory and tokens.

Two processes (``python -m graphflow.harness.pair --job agents``): role 0 is replica A, role 1
replica B. A workload is ``roots`` root contexts of ``root_tokens`` tokens each, whose state an
upstream step already computed on A (A's prefill of one root is measured and reported as
``root_prefill_s``), and ``agents_per_root`` agents per root, each with its own
``suffix_tokens``-token prompt, producing ``decode_tokens`` tokens. Agent ``j`` of a root runs on
replica ``j % 2`` (round robin) except under ``local_holder``. Per system, timed from the moment
the agents' requests arrive until both replicas have every agent's tokens:

* ``dense`` — every agent prefills its root and suffix from scratch;
* ``text`` — as dense, from the root's text re-tokenized (AAFLOW's text mode);
* ``local`` — per-replica prefix caching (what vLLM/SGLang give): A's agents reuse A's state;
  B computes each root once (a miss), then its agents reuse it;
* ``local_holder`` — prefix caching with cache-aware routing: every agent runs on A;
* ``ours`` — B fetches the root blocks from A over the transport; both replicas run agents.

Decoding is batched per replica for every system alike: a replica's agents run their suffixes
as one batch and decode as one batch (dense prefills each agent alone, then batches the decode).
Both processes share the host's monotonic clock; the makespan is the later replica's end minus
A's start. Memory, per replica, after the timed part: the KV each system keeps, in
``BlockStore``s (dense and text: one store per agent, nothing shared; the others: one store with
the roots once and each agent's private blocks), the working cache's bytes and the process's
peak RSS during the timed part (``VmHWM``, reset at the trial's start).
"""

from __future__ import annotations

import gc
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from graphflow.kv.codec import from_wire, to_wire
from graphflow.kv.exchange import spec_for_prompt
from graphflow.kv.operators import materialize
from graphflow.kv.packing import batch_cache, cache_nbytes, cache_to_blocks, stack_cache
from graphflow.kv.state import Lineage
from graphflow.kv.store import BlockStore
from graphflow.models.engine import Engine
from graphflow.models.prompts import prompt_token_ids
from graphflow.runtime.memory import release_freed_memory, reset_peak_rss, resident_bytes
from transport.base import TransferSpec
from transport.message import MessageTransport

__all__ = ["SYSTEMS", "AgentsPlan", "agents_side"]

SYSTEMS = ("dense", "text", "local", "local_holder", "ours")
READY, START, WANT, REPORT = 21, 22, 23, 24
_REPORT_BYTES = 1 << 16
_BLOCK = 16
_STORE_BYTES = 1 << 40


@dataclass(frozen=True, slots=True)
class AgentsPlan:
    model: str
    root_tokens: int
    workloads: list[tuple[int, int]]  # (roots, agents per root)
    suffix_tokens: int = 64
    decode_tokens: int = 32
    systems: tuple[str, ...] = SYSTEMS
    repeats: int = 1
    threads: int = 1

    def args(self) -> list[str]:
        """The plan as ``graphflow.harness.pair --job agents`` takes it."""
        loads = ",".join(f"{r}x{a}" for r, a in self.workloads)
        return [
            "--job",
            "agents",
            "--model",
            self.model,
            "--root-tokens",
            str(self.root_tokens),
            "--workloads",
            loads,
            "--suffix",
            str(self.suffix_tokens),
            "--decode",
            str(self.decode_tokens),
            "--systems",
            ",".join(self.systems),
            "--repeats",
            str(self.repeats),
            "--threads",
            str(self.threads),
        ]


@dataclass(slots=True)
class _Side:
    """What one replica measured in one trial."""

    agents: int = 0
    start: float = 0.0
    end: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    tokens: list[list[int]] = field(default_factory=list)
    stored_bytes: int = 0
    shared_bytes: int = 0
    working_bytes: int = 0
    rss_start: int = 0
    rss_peak: int = 0

    def report(self) -> dict[str, Any]:
        return {
            "agents": self.agents,
            "start": self.start,
            "end": self.end,
            "parts": self.parts,
            "tokens": self.tokens,
            "stored_bytes": self.stored_bytes,
            "shared_bytes": self.shared_bytes,
            "working_bytes": self.working_bytes,
            "rss_start": self.rss_start,
            "rss_peak": self.rss_peak,
        }


class _Workload:
    """Token ids of one workload's roots and agents, identical on both replicas."""

    def __init__(self, engine: Engine, plan: AgentsPlan, roots: int, per_root: int) -> None:
        tok = engine.tokenizer
        body = prompt_token_ids(tok, plan.root_tokens)
        self.roots = [(tok.encode(f"Workflow {r}. ") + body)[: plan.root_tokens] for r in range(roots)]
        self.held = plan.root_tokens // _BLOCK * _BLOCK  # whole blocks move; the tail joins the suffix
        self.branches: list[tuple[int, list[int]]] = []
        for r in range(roots):
            for j in range(per_root):
                ids = tok.encode(f"\nAgent {j + 1} of workflow {r}: check the work above and answer. ")
                filler = tok.encode(" Be brief.")
                self.branches.append((r, (ids + filler * plan.suffix_tokens)[: plan.suffix_tokens]))
        self.per_root = per_root
        # text replay re-tokenizes each root's text (SmolLM2: 4,096 ids → 4,028); a batch needs one length
        self.text_tokens = min(len(tok.encode(tok.decode(root))) for root in self.roots)

    def mine(self, system: str, role: int) -> list[int]:
        """Indices of the branches this replica runs under ``system``."""
        if system == "local_holder":
            return list(range(len(self.branches))) if role == 0 else []
        return [i for i in range(len(self.branches)) if (i % self.per_root) % 2 == role]

    def roots_of(self, branches: Sequence[int]) -> list[int]:
        return sorted({self.branches[i][0] for i in branches})


def agents_side(t: MessageTransport, role: int, peer: str, plan: AgentsPlan) -> dict[str, Any]:
    torch.set_num_threads(plan.threads)
    engine = Engine.load(plan.model)
    limit = int(getattr(engine.config, "max_position_embeddings", 0) or 0)
    if limit and plan.root_tokens + plan.suffix_tokens + plan.decode_tokens > limit:
        raise ValueError(
            f"{plan.root_tokens} root + {plan.suffix_tokens} suffix + {plan.decode_tokens} decoded "
            f"tokens exceed {plan.model}'s {limit} positions"
        )
    ids = itertools.count(1 << 24)
    out: dict[str, Any] = {
        "role": role,
        "model": plan.model,
        "kv_bytes_per_token": engine.kv_bytes_per_token(),
        "threads": plan.threads,
        "trials": [],
    }
    _warm_up(engine)
    for roots, per_root in plan.workloads:
        work = _Workload(engine, plan, roots, per_root)
        holder = _upstream(engine, work, out) if role == 0 else None
        for system, rep in itertools.product(plan.systems, range(plan.repeats)):
            side = _trial(t, role, peer, engine, plan, work, holder, system, ids)
            if role == 1:
                report = json.dumps(side.report()).encode()
                if len(report) > _REPORT_BYTES:
                    raise ValueError(
                        f"a trial report of {len(report)} bytes exceeds {_REPORT_BYTES}; "
                        "run fewer agents or fewer decode tokens per workload"
                    )
                t.send_control(peer, REPORT, report.ljust(_REPORT_BYTES))
                continue
            other = json.loads(t.recv_control(peer, REPORT, _REPORT_BYTES).decode().strip())
            out["trials"].append(_row(system, rep, roots, per_root, plan, side.report(), other))
        del holder
        gc.collect()
    return out


def _warm_up(engine: Engine) -> None:
    cache = engine.prefill(list(range(5, 37))).cache
    engine.decode_rows(cache, [7], 2)


def _upstream(engine: Engine, work: _Workload, out: dict[str, Any]) -> BlockStore:
    """A's state before the agents arrive: every root prefilled once (the first one timed)."""
    store = BlockStore(engine.identity, _STORE_BYTES, block_tokens=_BLOCK)
    for r, root in enumerate(work.roots):
        t0 = time.perf_counter()
        materialize(engine, store, root[: work.held], state_id=f"root{r}")
        if r == 0:  # prefill and block cutting of one root, the upstream's cost
            out.setdefault("root_prefill_s", {})[str(len(root))] = time.perf_counter() - t0
            out["root_bytes"] = store.used_bytes
    return store


def _trial(
    t: MessageTransport,
    role: int,
    peer: str,
    engine: Engine,
    plan: AgentsPlan,
    work: _Workload,
    holder: BlockStore | None,
    system: str,
    ids: Any,
) -> _Side:
    side = _Side()
    mine = work.mine(system, role)
    side.agents = len(mine)
    release_freed_memory()
    reset_peak_rss()
    side.rss_start = resident_bytes()[0]
    if role == 1:
        t.send_control(peer, READY, b"r")
        t.recv_control(peer, START, 1)
        side.start = time.monotonic()
    else:
        t.recv_control(peer, READY, 1)
        side.start = time.monotonic()
        t.send_control(peer, START, b"s")
    store = BlockStore(engine.identity, _STORE_BYTES, block_tokens=_BLOCK)
    kept: list[BlockStore] = []
    if system == "ours" and role == 0 and work.mine(system, 1):
        _serve_roots(t, peer, work, holder, ids)  # B asks at once; A answers before its own agents
    cache: Any = None
    prefixes: list[list[int]] = []
    rows: list[list[int]] = []
    if mine:
        cache, prefixes, rows = _prepare(t, role, peer, engine, work, holder, store, system, mine, side, ids)
        side.shared_bytes = store.used_bytes  # the roots this replica holds for its agents (none for dense, text)
        t0 = time.monotonic()
        firsts = engine.forward_rows(rows, cache)
        rest = engine.decode_rows(cache, firsts, plan.decode_tokens - 1)
        side.tokens = [[f, *r] for f, r in zip(firsts, rest, strict=True)]
        side.parts["agents_s"] = time.monotonic() - t0
    side.end = time.monotonic()
    side.rss_peak = resident_bytes()[1]
    if cache is not None:
        side.working_bytes = cache_nbytes(cache)
        kept = _keep(engine, work, store, system, mine, prefixes, rows, side.tokens, cache)
    side.stored_bytes = store.used_bytes + sum(s.used_bytes for s in kept)
    return side


def _serve_roots(t: MessageTransport, peer: str, work: _Workload, holder: BlockStore | None, ids: Any) -> None:
    assert holder is not None
    wanted = json.loads(t.recv_control(peer, WANT, 4096).decode().strip())
    for r in wanted:
        headers, tensors = to_wire(holder.blocks(f"root{r}"))
        t.send(TransferSpec.for_headers(next(ids), peer, headers), headers, tensors)


def _prepare(
    t: MessageTransport,
    role: int,
    peer: str,
    engine: Engine,
    work: _Workload,
    holder: BlockStore | None,
    store: BlockStore,
    system: str,
    mine: list[int],
    side: _Side,
    ids: Any,
) -> tuple[Any, list[list[int]], list[list[int]]]:
    """This replica's batch cache, the tokens each cache row holds, and the rows still to run,
    per ``system``."""
    held = work.held
    if system in ("dense", "text"):
        t0 = time.monotonic()
        kvs, prefixes, rows = [], [], []
        for i in mine:
            r, suffix = work.branches[i]
            root = work.roots[r]
            if system == "text":  # the upstream's text, tokenized again (rows of one batch share a length)
                root = engine.tokenizer.encode(engine.tokenizer.decode(root))[: work.text_tokens]
            whole = root + suffix
            pre = engine.prefill(whole[:-1])
            kvs.append(stack_cache(pre.cache))
            prefixes.append(whole[:-1])
            rows.append(whole[-1:])
            del pre
        side.parts["prefill_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        cache = batch_cache(kvs, engine.config)
        side.parts["rebuild_s"] = time.monotonic() - t1
        return cache, prefixes, rows
    needed = work.roots_of(mine)
    t0 = time.monotonic()
    if role == 0:
        assert holder is not None
        for r in needed:
            store.add_state(holder.blocks(f"root{r}"), Lineage("materialize"), state_id=f"root{r}")
    elif system == "ours":
        t.send_control(peer, WANT, json.dumps(needed).encode().ljust(4096))
        for r in needed:
            spec = spec_for_prompt(engine.identity, work.roots[r][:held], _BLOCK, peer, next(ids))
            got = t.recv(spec)
            store.add_state(from_wire(got.headers, got.tensors), Lineage("transfer"), state_id=f"root{r}")
        side.parts["transfer_s"] = time.monotonic() - t0
    else:  # local prefix caching on B: the first agent of each root misses and computes it
        for r in needed:
            materialize(engine, store, work.roots[r][:held], state_id=f"root{r}")
        side.parts["prefill_s"] = time.monotonic() - t0
    t1 = time.monotonic()
    root_kv = {r: torch.cat([b.tensor for b in store.blocks(f"root{r}")], dim=3) for r in needed}
    cache = batch_cache([root_kv[work.branches[i][0]] for i in mine], engine.config)
    side.parts["rebuild_s"] = time.monotonic() - t1
    rows = [work.roots[work.branches[i][0]][held:] + work.branches[i][1] for i in mine]
    return cache, [work.roots[work.branches[i][0]][:held] for i in mine], rows


def _keep(
    engine: Engine,
    work: _Workload,
    store: BlockStore,
    system: str,
    mine: list[int],
    prefixes: list[list[int]],
    rows: list[list[int]],
    tokens: list[list[int]],
    cache: Any,
) -> list[BlockStore]:
    """Store each agent's KV the way ``system`` keeps it; returns the per-agent stores (dense, text)."""
    kept: list[BlockStore] = []
    for row, (i, generated) in enumerate(zip(mine, tokens, strict=True)):
        new = rows[row] + generated[:-1]  # the last token has no KV yet
        if system in ("dense", "text"):
            own = BlockStore(engine.identity, _STORE_BYTES)
            blocks = cache_to_blocks(cache, prefixes[row] + new, engine.identity, _BLOCK, row=row)
            own.add_state(blocks, Lineage("materialize"))
            kept.append(own)
            continue
        (child,) = store.fork(f"root{work.branches[i][0]}", 1)
        start = len(prefixes[row])
        store.append(child.state_id, new, stack_cache(cache, start, start + len(new), row=row))
    return kept


def _row(
    system: str, rep: int, roots: int, per_root: int, plan: AgentsPlan, a: dict[str, Any], b: dict[str, Any]
) -> dict[str, Any]:
    """One tidy row from both replicas' reports (A's clock start, the later end)."""
    sides = {"a": a, "b": b}
    row: dict[str, Any] = {
        "system": system,
        "repeat": rep,
        "roots": roots,
        "agents_per_root": per_root,
        "agents": roots * per_root,
        "root_tokens": plan.root_tokens,
        "suffix_tokens": plan.suffix_tokens,
        "decode_tokens": plan.decode_tokens,
        "makespan_s": max(a["end"], b["end"]) - a["start"],
        "generated_tokens": sum(len(x) for s in sides.values() for x in s["tokens"]),
    }
    for name, s in sides.items():
        row[f"{name}_agents"] = s["agents"]
        row[f"{name}_busy_s"] = s["end"] - s["start"] if s["agents"] else 0.0
        for part in ("prefill_s", "transfer_s", "rebuild_s", "agents_s"):
            row[f"{name}_{part}"] = s["parts"].get(part, 0.0)
        row[f"{name}_stored_bytes"] = s["stored_bytes"]
        row[f"{name}_shared_bytes"] = s["shared_bytes"]
        row[f"{name}_working_bytes"] = s["working_bytes"]
        row[f"{name}_rss_peak_bytes"] = s["rss_peak"]
        row[f"{name}_rss_growth_bytes"] = max(0, s["rss_peak"] - s["rss_start"])
    row["tokens"] = json.dumps([a["tokens"], b["tokens"]])
    return row
