"""Time to first token of an agent whose upstream context lives on another replica.

Two processes (``python -m graphflow.harness.pair --job ttft``): role 0 is replica A, which
computed the upstream agent's state (``L`` context tokens); role 1 is replica B, where the
next agent runs with its own ``S``-token suffix. B measures, per context, from the moment the
request reaches it to its first token (median of ``repeats`` after one warm-up):

* ``ours`` — B asks A for the state (a control message), receives the KV blocks over the
  transport, rebuilds the cache and runs only the suffix;
* ``local`` — B already holds the blocks (a prefix-cache hit, what vLLM/SGLang give on the
  same replica): rebuild + suffix;
* ``text`` — the upstream text is re-tokenized and everything prefilled (AAFLOW's text mode);
* ``dense`` — the token ids are prefilled from scratch.

``ours`` is also split into its receive (request message included), cache rebuild and forward
parts. The bound and Ω are derived by ``experiments/ttft/run.py``.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from graphflow.bench.transport_pair import BenchPlan, run_pair
from graphflow.kv.codec import from_wire, to_wire
from graphflow.kv.exchange import spec_for_prompt
from graphflow.kv.packing import blocks_to_cache, cache_to_blocks
from graphflow.models.engine import Engine
from graphflow.models.prompts import prompt_token_ids
from transport.base import TransferSpec
from transport.memory import host_arena
from transport.message import MessageTransport

__all__ = ["TtftPlan", "ttft_side"]

GO, DONE = 11, 12
_AGENT = "\nNext agent: check the reasoning above and give the final answer as a number.\n"


@dataclass(frozen=True, slots=True)
class TtftPlan:
    model: str
    contexts: list[int]
    suffix_tokens: int = 64
    repeats: int = 3
    raw_mib: int = 64
    threads: int = 0  # torch threads of each process (0: torch's default, every core)


def _suffix(engine: Engine, n: int) -> list[int]:
    ids = engine.tokenizer.encode(_AGENT)
    return (ids * (n // max(1, len(ids)) + 1))[:n]


def _first_token(engine: Engine, ids: list[int], cache: Any = None) -> int:
    out = engine.prefill(ids, cache)
    return int(torch.argmax(out.logits))


def ttft_side(t: MessageTransport, role: int, peer: str, plan: TtftPlan) -> dict[str, Any]:
    if plan.threads:
        torch.set_num_threads(plan.threads)
    engine = Engine.load(plan.model)
    bpt, bt = engine.kv_bytes_per_token(), 16
    ids = itertools.count(1 << 24)
    # the raw reference (one plain message per transfer) and our block transfer, in this run
    bench = run_pair(t, role, peer, BenchPlan([plan.raw_mib << 20], 1 << 20, iters=3, warmup=1, repeats=3))
    out: dict[str, Any] = {
        "role": role,
        "model": plan.model,
        "kv_bytes_per_token": bpt,
        "rows": [],
        "transport_rows": [row.to_json() for row in bench],
        "threads": torch.get_num_threads(),
    }
    suffix = _suffix(engine, plan.suffix_tokens)
    limit = int(getattr(engine.config, "max_position_embeddings", 0) or 0)
    fits = [n for n in plan.contexts if not limit or n + len(suffix) <= limit]  # same on both sides
    out["skipped_contexts"] = [n for n in plan.contexts if n not in fits]
    if role == 1 and fits:
        # NOTE: B's receive pool is faulted in at startup, as a serving system allocates its KV
        # block pool; room for two states, the one held from the last repeat and the next
        out["reserved_bytes"] = host_arena().reserve(2 * max(fits) * bpt).nbytes
    for n in fits:
        upstream = prompt_token_ids(engine.tokenizer, n)
        held = n // bt * bt  # whole blocks move; the partial last block is recomputed with the suffix
        if role == 0:
            blocks = cache_to_blocks(engine.prefill(upstream).cache, upstream[:held], engine.identity, bt)
            headers, tensors = to_wire(blocks)
            for _ in range(plan.repeats + 1):
                t.recv_control(peer, GO, 1)
                t.send(TransferSpec.for_headers(next(ids), peer, headers), headers, tensors)
            t.recv_control(peer, DONE, 1)
            continue
        out["rows"].append(_agent_side(t, peer, engine, plan, upstream, held, suffix, ids))
        t.send_control(peer, DONE, b"d")
    return out


def _agent_side(
    t: MessageTransport,
    peer: str,
    engine: Engine,
    plan: TtftPlan,
    upstream: list[int],
    held: int,
    suffix: list[int],
    ids: Any,
) -> dict[str, Any]:
    rest = upstream[held:] + suffix
    parts: dict[str, list[float]] = {k: [] for k in ("ours", "recv", "rebuild", "forward", "local", "text", "dense")}
    firsts: set[int] = set()
    blocks: list[Any] = []
    for r in range(plan.repeats + 1):
        t0 = time.perf_counter()
        t.send_control(peer, GO, b"g")  # the request reached B: ask A for the state
        got = t.recv(spec_for_prompt(engine.identity, upstream[:held], 16, peer, next(ids)))
        t1 = time.perf_counter()
        blocks = from_wire(got.headers, got.tensors)
        cache = blocks_to_cache(blocks, engine.identity, engine.config)
        t2 = time.perf_counter()
        first = _first_token(engine, rest, cache)
        t3 = time.perf_counter()
        firsts.add(first)
        if r:
            for k, v in (("ours", t3 - t0), ("recv", t1 - t0), ("rebuild", t2 - t1), ("forward", t3 - t2)):
                parts[k].append(v)
    for r in range(plan.repeats + 1):
        t0 = time.perf_counter()
        first = _first_token(engine, rest, blocks_to_cache(blocks, engine.identity, engine.config))
        if r:
            parts["local"].append(time.perf_counter() - t0)
        firsts.add(first)
    text = engine.tokenizer.decode(upstream)
    for r in range(plan.repeats if len(upstream) > 4096 else plan.repeats + 1):
        t0 = time.perf_counter()
        first = _first_token(engine, engine.tokenizer.encode(text) + suffix)
        if r or len(upstream) > 4096:  # NOTE: long prefills are their own warm-up
            parts["text"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dense_first = _first_token(engine, upstream + suffix)
        if r or len(upstream) > 4096:
            parts["dense"].append(time.perf_counter() - t0)
        firsts.add(dense_first)
    med = {k: statistics.median(v) for k, v in parts.items()}
    nbytes = held * engine.kv_bytes_per_token()
    return {
        "context": len(upstream),
        "suffix": len(suffix),
        "nbytes": nbytes,
        **{f"{k}_s": v for k, v in med.items()},
        "same_first_token": len(firsts) == 1,
    }
