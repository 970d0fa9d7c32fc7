"""Transfer-vs-recompute sweep: both sides of the two-process job and the analysis.

Role 1 (receiver, where the node runs) measures, per context length L: recompute = a fresh
prefill of L tokens; transfer = receive L tokens' KV blocks from role 0 + rebuild the cache.
Before the sweep it calibrates on a *different* grid (prefill lengths, transfer sizes,
cache rebuilds), so predictions are never fitted on the points they predict. The sides
synchronise with control messages so no timing overlaps the other side's work:

```
receiver: calibrate prefill/resume ── probe recv ×k ── for L: recompute ×R ─ GO ─ … recv ×R
sender:                              probe send ×k ── for L:             wait GO ─ prefill ─ READY ─ send ×R
```
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from graphflow.bench.sweep_points import SweepPoint
from graphflow.kv.codec import from_wire, to_wire
from graphflow.kv.exchange import spec_for_prompt
from graphflow.kv.packing import blocks_to_cache, cache_to_blocks
from graphflow.models.engine import Engine
from graphflow.models.prompts import prompt_token_ids
from graphflow.runtime.calibration import median_seconds
from scheduler.calibrate import Profile, fit_linear, fit_link, fit_prefill
from scheduler.policy import Option, Policy, RemoteCopy, StateRequest, decide
from transport.base import TransferSpec
from transport.message import MessageTransport
from transport.probe import probe_pair

__all__ = ["SweepPlan", "analyse", "sweep_side"]

GO, READY, ACK = 1, 2, 3


@dataclass(frozen=True, slots=True)
class SweepPlan:
    model: str
    contexts: list[int]
    repeats: int = 3
    calib_lengths: tuple[int, ...] = (96, 384, 1536, 3000, 6000)
    probe_tokens: tuple[int, ...] = (48, 400, 1600, 5000)


def sweep_side(t: MessageTransport, role: int, peer: str, plan: SweepPlan) -> dict[str, Any]:
    engine = Engine.load(plan.model)
    bpt, bt = engine.kv_bytes_per_token(), 16
    ids = itertools.count(100)
    out: dict[str, Any] = {"role": role, "kv_bytes_per_token": bpt, "config_hash": engine.identity.config_hash}
    cal = _calib_lengths(plan)
    if role == 1:
        prefill, resume = [], []
        for n in cal:
            tokens = prompt_token_ids(engine.tokenizer, n)
            prefill.append((n, median_seconds(partial(engine.prefill, tokens), plan.repeats)))
            blocks = cache_to_blocks(engine.prefill(tokens).cache, tokens, engine.identity, bt)
            resume.append(
                (
                    n * bpt,
                    median_seconds(partial(blocks_to_cache, blocks, engine.identity, engine.config), plan.repeats),
                )
            )
        out["prefill_samples"], out["resume_samples"] = prefill, resume
    sizes = [n * bpt for n in plan.probe_tokens]
    probe = probe_pair(t, role, peer, sizes, bpt * bt, plan.repeats)
    out["probe_samples"] = probe
    rows = []
    for n in plan.contexts:
        tokens = prompt_token_ids(engine.tokenizer, n)
        if role == 1:
            recompute = median_seconds(partial(engine.prefill, tokens), plan.repeats)
            t.send_control(peer, GO, b"g")
            t.recv_control(peer, READY, 1)
            recv_s, resume_s = [], []
            for r in range(plan.repeats + 1):
                t0 = time.perf_counter()
                got = t.recv(spec_for_prompt(engine.identity, tokens, bt, peer, next(ids)))
                t1 = time.perf_counter()
                cache = blocks_to_cache(from_wire(got.headers, got.tensors), engine.identity, engine.config)
                t2 = time.perf_counter()
                assert cache.get_seq_length() == n
                if r:
                    recv_s.append(t1 - t0)
                    resume_s.append(t2 - t1)
                t.send_control(peer, ACK, b"k")
            both = [a + b for a, b in zip(recv_s, resume_s, strict=True)]
            rows.append(
                {
                    "context": n,
                    "nbytes": n * bpt,
                    "recompute_s": recompute,
                    "recv_s": statistics.median(recv_s),
                    "resume_s": statistics.median(resume_s),
                    "transfer_s": statistics.median(both),
                }
            )
        else:
            t.recv_control(peer, GO, 1)
            blocks = cache_to_blocks(engine.prefill(tokens).cache, tokens, engine.identity, bt)
            headers, tensors = to_wire(blocks)
            t.send_control(peer, READY, b"r")
            for _ in range(plan.repeats + 1):
                t.send(TransferSpec.for_headers(next(ids), peer, headers), headers, tensors)
                t.recv_control(peer, ACK, 1)
    out["rows"] = rows
    return out


def _calib_lengths(plan: SweepPlan) -> list[int]:
    """Calibration lengths up to the largest context, never on the sweep grid; at least three."""
    top = max(plan.contexts)
    cal = [n for n in plan.calib_lengths if n <= top]
    if len(cal) < 3:
        cal = sorted({max(2, int(top * f)) for f in (0.07, 0.23, 0.61, 0.93)} - set(plan.contexts))
    return cal


def analyse(result: dict[str, Any], model: str, link_name: str) -> tuple[list[SweepPoint], Profile]:
    """Fit the profile from the run's calibration, predict and decide every sweep point."""
    prof = Profile(
        model=model,
        config_hash=result["config_hash"],
        kv_bytes_per_token=result["kv_bytes_per_token"],
        prefill=fit_prefill([tuple(x) for x in result["prefill_samples"]], model),
        resume=fit_linear([tuple(x) for x in result["resume_samples"]]),
        links={link_name: fit_link([tuple(x) for x in result["probe_samples"]], link_name)},
    )
    pol = Policy(prof.prefill, resume=prof.resume)
    out = []
    for row in result["rows"]:
        req = StateRequest(
            "receiver",
            row["context"],
            prof.kv_bytes_per_token,
            remote=(RemoteCopy("sender", row["context"], prof.links[link_name]),),
        )
        measured = {Option.RECOMPUTE: row["recompute_s"], Option.TRANSFER: row["transfer_s"]}
        d = decide(req, pol)
        out.append(
            SweepPoint(
                model,
                link_name,
                row["context"],
                row["nbytes"],
                prof.links[link_name].gbps,
                row["recompute_s"],
                row["transfer_s"],
                row["recv_s"],
                row["resume_s"],
                d.with_measured(measured[d.option], measured),
            )
        )
    return out, prof
