"""KV memory vs fidelity: stateful, differential (with and without pruning) and stateless KV.

``python -m experiments.kv_memory.run --model smollm2-135m [--tasks 50] [--quick] [--json]``

1. The trained planner generates a workflow for each real task (GSM8K from shared/data); the
   path keys ``(P, v)`` of all of them are counted and the hot ones chosen (``--min-count``).
2. Each workflow is executed exactly with the real model in the executor's prompt layout (each
   node greedily generates ``--decode`` tokens, which later nodes read). For each node the
   exact template KV is kept (what per-workflow, "stateful" caching holds).
3. Online, like a running system: the first ``--refs`` executions of a path key teach its
   residual (averaged); every later execution is served from base + residual and scored against
   the exact run — teacher-forced next-token agreement and mean KL(exact ‖ approx) over the
   node's generated tokens — for every residual codec, and base-only (stateless).

Bytes are the real sizes of the tensors each store holds. Writes ``results/executions.csv``
(one row per scored execution × codec), ``results/summary.json``, ``results/memory.png`` and
the README tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from experiments.common import (
    add_provenance,
    guard_tree,
    output_dir,
    read_csv,
    replace_section,
    write_csv,
    write_meta,
)
from experiments.kv_memory.plot import plot
from graphflow.kv.differential.base import base_kv
from graphflow.kv.differential.codecs import ResidualCodec, apply_residual
from graphflow.kv.differential.paths import PathKey, PathStats
from graphflow.kv.differential.recompute import rebuild_template
from graphflow.kv.differential.store import DifferentialKV
from graphflow.kv.packing import cache_from_tensor, stack_cache
from graphflow.models.engine import Engine
from graphflow.workflow.compile import ROOT, ExecGraph, compile_workflow, node_context, node_path
from graphflow.workflow.planner import Planner
from graphflow.workflow.tasks import load_tasks

HERE = Path(__file__).parent
CODECS = (
    ResidualCodec(),
    ResidualCodec(keep_per_row=16),
    ResidualCodec(keep_per_row=8),
    ResidualCodec(keep_per_row=4),
    ResidualCodec(keep_per_row=8, sink_tokens=3),
    ResidualCodec(keep_per_row=4, sink_tokens=3),
    ResidualCodec(keep_per_row=2, sink_tokens=3),
    ResidualCodec(recompute_head=8),
    ResidualCodec(recompute_head=12),
    ResidualCodec(keep_per_row=16, recompute_head=8),
    ResidualCodec(keep_per_row=16, recompute_head=12),
    ResidualCodec(keep_per_row=8, recompute_head=12),
    ResidualCodec(recompute_head=16),
    ResidualCodec(keep_per_row=16, recompute_head=16),
    ResidualCodec(keep_per_row=8, recompute_head=16),
    ResidualCodec(recompute_head=20),
    ResidualCodec(keep_per_row=16, recompute_head=20),
    ResidualCodec(recompute_head=24),
    ResidualCodec(keep_per_row=16, recompute_head=24),
)
QUICK_CODECS = (
    ResidualCodec(),
    ResidualCodec(keep_per_row=4, sink_tokens=3),
    ResidualCodec(keep_per_row=16, recompute_head=12),
)
CONCURRENCY = (10, 20, 50)


@dataclass
class Node:
    workflow: int
    key: PathKey
    template_tokens: int


def plan(planner: Planner, texts: list[str]) -> tuple[list[ExecGraph], PathStats]:
    graphs = [compile_workflow(planner.generate(t)) for t in texts]
    stats = PathStats()
    for gs in graphs:
        stats.observe(PathKey(node_path(gs, n.id), n.role) for n in gs.nodes)
    return graphs, stats


def kl_and_agreement(ref_logits: torch.Tensor, logits: torch.Tensor) -> tuple[float, float]:
    ref, got = torch.log_softmax(ref_logits, -1), torch.log_softmax(logits, -1)
    kl = float((ref.exp() * (ref - got)).sum(-1).mean())
    agree = float((ref_logits.argmax(-1) == logits.argmax(-1)).float().mean())
    return agree, kl


@torch.inference_mode()
def teacher_forced(
    engine: Engine,
    prefix_kv: torch.Tensor,
    template_kv: torch.Tensor,
    template: list[int],
    generated: list[int],
    tail: int = 1,
) -> torch.Tensor:
    """Logits predicting each generated token when the template's KV is given for all but its
    last ``tail`` tokens, which are recomputed exactly with the generated tokens but the last."""
    kv = torch.cat((prefix_kv, template_kv[:, :, :, : len(template) - tail].to(prefix_kv.dtype)), dim=3)
    cache = cache_from_tensor(kv, engine.config)
    ids = torch.tensor([[*template[len(template) - tail :], *generated[:-1]]], dtype=torch.long)
    return engine.model(input_ids=ids, cache=cache, use_cache=True).logits[0, tail - 1 :].float()


def unique_tokens(seqs: list[list[int]]) -> int:
    """Tokens a prefix-sharing (radix) cache holds for these sequences."""
    root: dict[int, Any] = {}
    n = 0
    for seq in seqs:
        node = root
        for t in seq:
            if t not in node:
                node[t] = {}
                n += 1
            node = node[t]
    return n


def run(
    model: str,
    n_tasks: int,
    decode: int,
    refs: int,
    min_count: int,
    codecs: tuple[ResidualCodec, ...],
    max_task_tokens: int,
    recompute_tail: int = 1,
    say: Any = print,
) -> dict[str, Any]:
    engine = Engine.load(model)
    enc = engine.tokenizer.encode
    rope = engine.identity.rope
    texts = [t.text for t in load_tasks() if t.benchmark == "GSM8K"][:n_tasks]
    graphs, stats = plan(Planner.load(), texts)
    hot = stats.hot(min_count=min_count)
    say(f"{len(graphs)} workflows, {len(stats.counts)} path keys, {len(hot)} hot (≥ {min_count} executions)")
    stores = {c.label: DifferentialKV(engine.identity.model_key, rope, c, reference_executions=refs) for c in codecs}
    pruned = {c.label: DifferentialKV(engine.identity.model_key, rope, c, hot, refs) for c in codecs}
    bases: dict[str, torch.Tensor] = {}
    nodes: list[Node] = []
    stateful: list[list[torch.Tensor]] = []  # per workflow, the template KVs it holds
    whole_tokens: list[int] = []
    rows: list[dict[str, Any]] = []
    timing: dict[str, list[float]] = defaultdict(list)
    enc_cache: dict[str, list[int]] = {}

    def encode(text: str) -> list[int]:
        if text not in enc_cache:
            enc_cache[text] = enc(text)
        return enc_cache[text]

    start = time.perf_counter()
    for w, (gs, text) in enumerate(zip(graphs, texts, strict=True)):
        task_ids = encode(text)[:max_task_tokens]
        contexts: dict[str, list[int]] = {ROOT: task_ids}
        outputs: dict[str, list[int]] = {}
        held: list[torch.Tensor] = []
        for node in gs.nodes:
            ctx = node_context(node, contexts, outputs, task_ids, encode)
            tmpl = encode(node.template)
            prefix = ctx[: len(ctx) - len(tmpl)]
            key = PathKey(node_path(gs, node.id), node.role)
            if node.role not in bases:
                base = base_kv(engine, tmpl)
                bases[node.role] = base.float()
                for s in (*stores.values(), *pruned.values()):
                    s.add_base(node.role, tmpl, base)
            pre = engine.prefill(prefix)
            out = engine.prefill(tmpl, pre.cache)
            timing["template_prefill_s"].append(out.seconds)
            exact = stack_cache(out.cache, len(prefix)).clone()
            prefix_kv = stack_cache(out.cache, 0, len(prefix)).clone()
            first = int(out.logits.argmax())
            dec = engine.decode_greedy(out.cache, first, decode - 1) if decode > 1 else None
            generated = [first, *(dec.token_ids if dec else ())]
            # logits that chose each generated token: the template's last, then each decode step's
            ref_logits = torch.cat((out.logits[None], dec.logits)) if dec else out.logits[None]
            contexts[node.id], outputs[node.id] = ctx, generated
            held.append(exact)
            nodes.append(Node(w, key, len(tmpl)))
            learning = next(iter(stores.values())).wants(key)
            if not learning and key.op in bases:
                stateless = apply_residual(bases[key.op], None, len(prefix), rope)
                scored = {"exact (stateful)": exact.float(), "stateless": stateless}
                for label, store in stores.items():
                    t0 = time.perf_counter()
                    approx = rebuild_template(engine, store, key, prefix_kv, tmpl)
                    timing[f"reconstruct_s:{label}"].append(time.perf_counter() - t0)
                    if approx is not None:
                        scored[label] = approx
                for label, approx in scored.items():
                    scoring = stores.get(label)  # None for the exact and stateless references
                    # a codec that recomputes the template's head is not also scored with its tail recomputed
                    tail_too = scoring is not None and recompute_tail > 1 and not scoring.codec.recompute_head
                    res = scoring.residuals.get(key) if scoring is not None else None
                    for tail in (1, recompute_tail) if tail_too else (1,):
                        logits = teacher_forced(engine, prefix_kv, approx, tmpl, generated, tail)
                        agree, kl = kl_and_agreement(ref_logits, logits)
                        rows.append(
                            {
                                "workflow": w,
                                "node": node.id,
                                "path": str(key),
                                "hot": key in hot,
                                "codec": label if tail == 1 else f"{label}, last {tail} recomputed",
                                "agreement": agree,
                                "kl": kl,
                                "offset": len(prefix),
                                "template_tokens": len(tmpl),
                                "residual_bytes": res.encoded.nbytes if res else 0,
                                "dense_template_bytes": exact.numel() * exact.element_size(),
                            }
                        )
            for store in (*stores.values(), *pruned.values()):
                store.observe(key, exact, len(prefix))
        stateful.append(held)
        whole_tokens.append(unique_tokens([[*contexts[n.id], *outputs[n.id]] for n in gs.nodes]))
        say(f"workflow {w + 1}/{len(graphs)}: {len(gs.nodes)} nodes, {time.perf_counter() - start:.0f} s")
    return {
        "rows": rows,
        "nodes": nodes,
        "stateful": stateful,
        "stores": stores,
        "pruned": pruned,
        "hot": hot,
        "stats": stats,
        "whole_tokens": whole_tokens,
        "timing": timing,
        "bpt": engine.kv_bytes_per_token(),
    }


def held_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def summarize(r: dict[str, Any], target_sd: float = 0.2) -> dict[str, Any]:
    rows, nodes, stores, pruned = r["rows"], r["nodes"], r["stores"], r["pruned"]
    by_codec: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_codec[row["codec"]].append(row)
    dense_tmpl = statistics.median(row["dense_template_bytes"] for row in rows) if rows else 0
    curve = []
    variants = [(v, s) for s in stores for v in by_codec if v == s or v.startswith(f"{s}, last ")]
    for variant, label in variants:
        store = stores[label]
        sel = [x for x in by_codec.get(variant, []) if x["hot"]]
        if not sel:
            continue
        sd = statistics.median(x["residual_bytes"] / x["dense_template_bytes"] for x in sel)
        rebuild = r["timing"].get(f"reconstruct_s:{label}")
        curve.append(
            {
                "codec": variant,
                "store": label,
                "residual_to_dense": sd,
                "rebuild_s_median": statistics.median(rebuild) if rebuild else None,
                "agreement": statistics.fmean(x["agreement"] for x in sel),
                "kl": statistics.fmean(x["kl"] for x in sel),
                "scored": len(sel),
                "differential_bytes": sum(pruned[label].nbytes().values()),
                "differential_nopruning_bytes": sum(store.nbytes().values()),
            }
        )
    stateless = [x for x in by_codec.get("stateless", []) if x["hot"]]
    exact_rows = [x for x in by_codec.get("exact (stateful)", []) if x["hot"]]
    good = [c for c in curve if c["agreement"] >= 0.98]
    op = min(good, key=lambda c: c["differential_bytes"]) if good else max(curve, key=lambda c: c["agreement"])
    sparse = [c for c in curve if c["residual_to_dense"] <= target_sd]
    sparse_pt = max(sparse, key=lambda c: c["agreement"]) if sparse else None
    stateful_bytes = sum(held_bytes(h) for h in r["stateful"])
    per_path: dict[str, int] = defaultdict(int)
    for x in by_codec.get("stateless", []):
        if x["hot"]:
            per_path[x["path"]] += 1
    bpt = r["bpt"]
    template_tokens = sum(n.template_tokens for n in nodes)
    non_template = sum(r["whole_tokens"]) - template_tokens
    conc = []
    op_store = r["pruned"][op["store"]]
    for n in CONCURRENCY:
        if n > len(r["stateful"]):
            continue
        keys = {x.key for x in nodes if x.workflow < n}
        ops = {k.op for k in keys}
        diff = sum(op_store.bases[o].nbytes for o in ops if o in op_store.bases)
        diff += sum(res.encoded.nbytes for k, res in op_store.residuals.items() if k in keys)
        conc.append(
            {
                "workflows": n,
                "stateful_bytes": sum(held_bytes(h) for h in r["stateful"][:n]),
                "differential_bytes": diff,
            }
        )
    t = r["timing"]
    return {
        "workflows": len(r["stateful"]),
        "path_keys": len(r["stats"].counts),
        "hot_paths": sorted(str(k) for k in r["hot"]),
        "executions_per_path": dict(sorted(per_path.items(), key=lambda kv: -kv[1])),
        "dense_template_bytes_median": dense_tmpl,
        "stateful_bytes": stateful_bytes,
        "differential_bytes": op["differential_bytes"],
        "differential_nopruning_bytes": op["differential_nopruning_bytes"],
        "stateless_bytes": sum(op_store.bases[o].nbytes for o in op_store.bases),
        "operating_codec": op["codec"],
        "residual_to_dense": op["residual_to_dense"],
        "agreement_differential": op["agreement"],
        "kl_differential": op["kl"],
        "agreement_stateless": statistics.fmean(x["agreement"] for x in stateless) if stateless else None,
        "kl_stateless": statistics.fmean(x["kl"] for x in stateless) if stateless else None,
        "agreement_stateful_check": statistics.fmean(x["agreement"] for x in exact_rows) if exact_rows else None,
        "sparse_point": {
            "codec": sparse_pt["codec"],
            "residual_to_dense": sparse_pt["residual_to_dense"],
            "agreement": sparse_pt["agreement"],
        }
        if sparse_pt
        else None,
        "curve": curve,
        "whole_workflow": {
            "stateful_bytes": stateful_bytes + non_template * bpt,
            "differential_bytes": op["differential_bytes"] + non_template * bpt,
            "non_template_tokens": non_template,
            "kv_bytes_per_token": bpt,
        },
        "concurrency": conc,
        "template_prefill_s_median": statistics.median(t["template_prefill_s"]),
        "reconstruct_s_median": statistics.median(rec) if (rec := t.get(f"reconstruct_s:{op['store']}")) else None,
    }


def tables(s: dict[str, Any], settings: dict[str, Any]) -> str:
    mib = 1 << 20
    lines = [
        f"{s['workflows']} GSM8K workflows generated by the trained planner; {s['path_keys']} path keys, "
        f"hot (≥ {settings['min_count']} executions): {', '.join(s['hot_paths'])}. Residuals learned from the "
        f"first {settings['refs']} executions of each path, scored on the rest "
        f"({', '.join(f'{k}: {v}' for k, v in s['executions_per_path'].items())}); "
        f"{settings['decode']} teacher-forced tokens per execution.\n",
        "| codec | S/D (residual ÷ dense template KV) | agreement | mean KL (nats) | differential MiB "
        "| no pruning MiB | rebuild ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in s["curve"]:
        diff, nopr = c["differential_bytes"] / mib, c["differential_nopruning_bytes"] / mib
        ms = f"{c['rebuild_s_median'] * 1e3:.1f}" if c.get("rebuild_s_median") is not None else ""
        lines.append(
            f"| {c['codec']} | {c['residual_to_dense']:.3f} | {c['agreement']:.4f} | {c['kl']:.4f} "
            f"| {diff:.2f} | {nopr:.2f} | {ms} |"
        )
    lines += [
        "",
        "| store | template KV MiB | whole-workflow KV MiB | agreement | mean KL |",
        "|---|---|---|---|---|",
        f"| stateful (per workflow) | {s['stateful_bytes'] / mib:.2f} | "
        f"{s['whole_workflow']['stateful_bytes'] / mib:.2f} | {s['agreement_stateful_check']:.4f} (check) | 0 |",
        f"| differential ({s['operating_codec']}) | {s['differential_bytes'] / mib:.2f} | "
        f"{s['whole_workflow']['differential_bytes'] / mib:.2f} | {s['agreement_differential']:.4f} "
        f"| {s['kl_differential']:.4f} |",
        f"| differential, no pruning | {s['differential_nopruning_bytes'] / mib:.2f} | | | |",
        f"| stateless (bases only) | {s['stateless_bytes'] / mib:.2f} | | {s['agreement_stateless']:.4f} "
        f"| {s['kl_stateless']:.4f} |",
        "",
        "| concurrent workflows | stateful MiB | differential MiB | ratio |",
        "|---|---|---|---|",
    ]
    for c in s["concurrency"]:
        ratio = c["differential_bytes"] / c["stateful_bytes"]
        lines.append(
            f"| {c['workflows']} | {c['stateful_bytes'] / mib:.2f} | {c['differential_bytes'] / mib:.2f} "
            f"| {ratio:.3f} |"
        )
    rec = s["reconstruct_s_median"]
    lines.append(
        f"\nTemplate prefill (after its prefix) median {s['template_prefill_s_median'] * 1e3:.1f} ms; "
        f"rebuild at the operating point ({s['operating_codec']}: base + residual, re-rotated, and its "
        f"recomputed head if any) median {rec * 1e3 if rec else float('nan'):.1f} ms; same run. "
        '`rebuild ms` above: per codec (the "last 4 recomputed" rows add that recompute when scoring, '
        "not in this column)."
    )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument(
        "--tasks", type=int, default=100, help="GSM8K tasks (one workflow each; 100 give 6 paths ≥ 34 executions)"
    )
    p.add_argument("--decode", type=int, default=16, help="tokens each node generates and is scored on")
    p.add_argument("--refs", type=int, default=4, help="exact executions averaged into a path's residual")
    p.add_argument(
        "--min-count", type=int, default=34, help="executions that make a path key hot (34: 4 learned from + 30 scored)"
    )
    p.add_argument("--max-task-tokens", type=int, default=384)
    p.add_argument(
        "--recompute-tail",
        type=int,
        default=4,
        help="also score each codec with the template's last K tokens recomputed exactly (1 = off)",
    )
    p.add_argument(
        "--quick", action="store_true", help="6 tasks, 4 tokens, three codecs (≤ 60 s); writes out/quick/, not results/"
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    add_provenance(p)
    args = p.parse_args()
    guard_tree(args.allow_dirty, args.quick)
    if args.quick:
        args.tasks, args.decode, args.refs, args.min_count = 6, 4, 1, 2
    codecs = QUICK_CODECS if args.quick else CODECS
    say = (lambda _m: None) if args.json else print
    if args.recompute_tail < 1:
        raise SystemExit("--recompute-tail must be at least 1")
    r = run(
        args.model,
        args.tasks,
        args.decode,
        args.refs,
        args.min_count,
        codecs,
        args.max_task_tokens,
        args.recompute_tail,
        say,
    )
    if not r["rows"]:
        raise SystemExit("no execution was scored: every path key was still learning; run more --tasks")
    s = summarize(r)
    keys = ("tasks", "decode", "refs", "min_count", "max_task_tokens", "recompute_tail", "quick")
    settings = {k: getattr(args, k) for k in keys}
    results = output_dir(HERE, args.quick)
    results.mkdir(parents=True, exist_ok=True)
    write_csv(results / "executions.csv", r["rows"])
    (results / "summary.json").write_text(json.dumps({"model": args.model, **settings, **s}, indent=2))
    plot(read_csv(results / "executions.csv"), results / "memory.png")
    if not args.quick:
        write_meta(HERE, model=args.model, codecs=[c.label for c in codecs], **settings)
        replace_section(HERE / "README.md", "table", tables(s, settings))
    if args.json:
        print(json.dumps({"model": args.model, **s}))
    else:
        print(tables(s, settings))


if __name__ == "__main__":
    main()
