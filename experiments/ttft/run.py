"""TTFT of an agent whose upstream state lives on another replica: ours vs dense, text replay
and local prefix reuse, against the physical bound.

``python -m experiments.ttft.run [--models qwen2-0.5b-shape,smollm2-135m] [--contexts 1024,4096,8192,16384]
[--quick] [--json]``

Each model runs as two UCX processes (replica A holds the state, replica B runs the agent);
see ``graphflow/bench/ttft.py`` for what each system's timing covers. Writes
``results/ttft.csv``, ``meta.json``, ``results/ttft.png`` and the README table.

``--served`` (SmolLM2 at 1K and 4K by default; ``--models a,b`` runs each model's deployment in
turn, skipping contexts beyond its positions) measures the same agent through the served path
(``experiments/ttft/served.py``: ``connect()`` → executor → replica actors → manager → UCX) and,
in the same run and with the same torch threads, the scripted pair; writes ``results/served/``
(CSV, ``meta.json`` with each deployment's threads, prefault and measured link) and the README's
served table, never the scripted study's files.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from experiments.common import (
    add_provenance,
    guard_tree,
    output_dir,
    progress,
    read_csv,
    replace_section,
    write_csv,
    write_meta,
)
from experiments.ttft.plot import plot
from graphflow.bench.transport_rows import TransportRow
from graphflow.harness.launch import run_two_processes

HERE = Path(__file__).parent
SYSTEMS = ("dense", "text", "local", "ours")
CAPACITY_MIB = 2048  # --served: KV store per replica, all prefaulted
QUICK_CAPACITY_MIB = 256  # --served --quick: room for the 1024-token context and the agents' KV
PUBLISHED = "AAFLOW+ reports TTFT up to 50.2× faster than dense prefill (published, modeled in their code)"


def measure(model: str, contexts: list[int], suffix: int, repeats: int, threads: int = 0) -> list[dict[str, Any]]:
    job = [
        "--job",
        "ttft",
        "--model",
        model,
        "--contexts",
        ",".join(map(str, contexts)),
        "--suffix",
        str(suffix),
        "--repeats",
        str(repeats),
        "--timeout",
        "1200",
        "--threads",
        str(threads),
    ]
    holder, got = run_two_processes("ucx", job, timeout_s=7200)
    bw = TransportRow.from_json(holder["transport_rows"][0]).raw_gbps * 1e9  # plain UCX messages, measured in this run
    if got["skipped_contexts"]:
        print(f"{model}: skipped contexts {got['skipped_contexts']} (beyond the model's positions)")
    return [derive({"model": model, **r, "raw_bandwidth_bytes_per_s": bw}) for r in got["rows"]]


def physical_bound(forward_s: float, nbytes: float, raw_bytes_per_s: float) -> float:
    """The agent's suffix forward + its KV bytes at the raw speed measured in the same run."""
    if raw_bytes_per_s <= 0:
        raise ValueError(f"the raw bandwidth must be positive, got {raw_bytes_per_s} bytes/s")
    return forward_s + nbytes / raw_bytes_per_s


def raw_bandwidths(rows: list[dict[str, Any]]) -> str:
    """Each model's raw UCX bandwidth in ``rows``, GB/s (``qwen2-0.5b-shape 15.43, …``)."""
    bw = {r["model"]: float(r["raw_bandwidth_bytes_per_s"]) / 1e9 for r in rows}
    return ", ".join(f"{m} {v:.2f}" for m, v in bw.items())


def derive(r: dict[str, Any]) -> dict[str, Any]:
    """Bound and ratios from the measured columns: bound = the agent's suffix forward on the
    received cache + KV bytes ÷ raw bandwidth (same run); Ω = ours − bound, everything the path
    adds beyond moving the bytes at raw speed and computing (request message, header and
    checksums, cache rebuild, Python)."""
    f = {k: float(v) for k, v in r.items() if k.endswith("_s") or k in ("nbytes", "raw_bandwidth_bytes_per_s")}
    bound = physical_bound(f["forward_s"], f["nbytes"], f["raw_bandwidth_bytes_per_s"])
    return {
        **{k: v for k, v in r.items() if k not in ("omega_s",)},
        "bound_s": bound,
        "omega_s": f["ours_s"] - bound,
        "ours_over_bound": f["ours_s"] / bound,
        "dense_over_ours": f["dense_s"] / f["ours_s"],
        "text_over_ours": f["text_s"] / f["ours_s"],
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def f(r: dict[str, Any], k: str) -> float:
        return float(r[k])

    longest = {}
    for r in rows:
        if r["model"] not in longest or int(r["context"]) > int(longest[r["model"]]["context"]):
            longest[r["model"]] = r
    qwen = longest.get("qwen2-0.5b-shape")
    return {
        "ttft_ratio_16k": f(qwen, "dense_over_ours") if qwen and int(qwen["context"]) >= 16384 else None,
        "ttft_ratio_longest": {m: f(r, "dense_over_ours") for m, r in longest.items()},
        "ttft_over_bound_max": max(f(r, "ours_over_bound") for r in rows),
        "omega_ms": max(f(r, "omega_s") for r in rows) * 1e3,
        "omega_ms_median": statistics.median(f(r, "omega_s") for r in rows) * 1e3,
        "rows": len(rows),
    }


def table(rows: list[dict[str, str]]) -> str:
    lines = [
        "| model | context | dense s | text replay s | local reuse s | scripted transfer s | bound s "
        "| scripted ÷ bound | dense ÷ scripted | Ω ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['context']} | {float(r['dense_s']):.3f} | {float(r['text_s']):.3f} "
            f"| {float(r['local_s']):.3f} | {float(r['ours_s']):.3f} | {float(r['bound_s']):.3f} "
            f"| {float(r['ours_over_bound']):.2f} | {float(r['dense_over_ours']):.1f} "
            f"| {float(r['omega_s']) * 1e3:.2f} |"
        )
    lines.append(
        "\nRaw UCX bandwidth (one plain 64 MiB message, measured in the same run; GB/s): "
        + raw_bandwidths(rows)
        + f". {PUBLISHED}."
    )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None, help="(default: qwen2-0.5b-shape,smollm2-135m; --served: smollm2-135m)")
    p.add_argument("--contexts", default=None, help="tokens (default: 1024,4096,8192,16384; --served: 1024,4096)")
    p.add_argument("--suffix", type=int, default=64, help="the agent's own prompt tokens (scripted and --served)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--quick",
        action="store_true",
        help="smollm2-135m at 256 and 1024 tokens, 1 repeat, written under out/ (≤ 60 s; --served ≤ 2 min)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.add_argument("--report", action="store_true", help="only regenerate table, plot and summary from the CSV")
    p.add_argument(
        "--served",
        action="store_true",
        help="served path against the scripted pair, same run (default smollm2-135m at 1024,4096; "
        "several --models run one after another, each skipping contexts beyond its positions)",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads of every process (0: this process's count)")
    p.add_argument(
        "--capacity-mib",
        type=int,
        default=0,
        help=f"--served: KV store per replica, all prefaulted (default {CAPACITY_MIB}; --quick {QUICK_CAPACITY_MIB})",
    )
    add_provenance(p)
    args = p.parse_args()
    guard_tree(args.allow_dirty, args.quick)
    results = output_dir(HERE, args.quick)
    if args.served:
        _served(args)
        return
    if args.report:
        rows = [derive(r) for r in read_csv(results / "ttft.csv")]
        write_csv(results / "ttft.csv", rows)
        _publish(rows, results, args.json)
        return
    if args.quick:
        args.models, args.contexts, args.repeats = "smollm2-135m", "256,1024", 1
    args.models = args.models or "qwen2-0.5b-shape,smollm2-135m"
    args.contexts = args.contexts or "1024,4096,8192,16384"
    models, contexts = _models_and_contexts(args.models, args.contexts)
    if any(c < 16 for c in contexts) or args.suffix < 1 or args.repeats < 1:
        raise SystemExit("contexts must be at least 16 tokens, --suffix and --repeats at least 1")
    rows: list[dict[str, Any]] = []
    say = progress(args.json)
    for model in models:
        say(f"{model}: the scripted pair at {contexts} tokens, {args.repeats}× each")
        rows += measure(model, contexts, args.suffix, args.repeats)
    write_csv(results / "ttft.csv", rows)
    settings = {"models": models, "contexts": contexts, "suffix": args.suffix, "repeats": args.repeats}
    write_meta(results if args.quick else HERE, **settings, quick=args.quick, backend="ucx", processes=2)
    _publish(rows, results, args.json)


def _models_and_contexts(models: str, contexts: str) -> tuple[list[str], list[int]]:
    """``--models`` and ``--contexts`` checked: known models, integer contexts (else one sentence)."""
    from graphflow.cli._common import ints, names
    from graphflow.models.registry import resolve

    try:
        listed = names(models)
        for name in listed:
            resolve(name)
        return listed, ints(contexts, "--contexts")
    except ValueError as e:
        raise SystemExit(str(e)) from None


def served_settings(args: argparse.Namespace) -> tuple[list[str], list[int], int, int]:
    """(models, contexts, repeats, KV store MiB per replica) of a ``--served`` run, checked.
    ``--quick`` takes the scripted quick sizes and a smaller store to prefault."""
    if args.quick:
        args.models, args.contexts, args.repeats = "smollm2-135m", "256,1024", 1
    models, contexts = _models_and_contexts(args.models or "smollm2-135m", args.contexts or "1024,4096")
    if args.repeats < 1 or args.suffix < 1 or any(c < 16 for c in contexts):
        raise SystemExit("--served takes contexts of at least 16 tokens, --suffix and --repeats ≥ 1")
    repeats = 1 if args.quick else max(args.repeats, 3)  # NOTE: full runs keep medians of three or more
    return models, contexts, repeats, args.capacity_mib or (QUICK_CAPACITY_MIB if args.quick else CAPACITY_MIB)


def _served(args: argparse.Namespace) -> None:
    import torch

    from experiments.ttft.served import served_rows

    models, contexts, repeats, capacity_mib = served_settings(args)
    threads = args.threads or torch.get_num_threads()
    rows: list[dict[str, Any]] = []
    deployments: dict[str, Any] = {}
    say = progress(args.json)
    for model in models:
        say(f"{model}: starting two replicas ({threads} torch threads each, {capacity_mib} MiB of KV prefaulted)")
        served = served_rows(model, contexts, repeats, threads, capacity_mib, args.suffix, say)
        if not served["rows"]:
            raise SystemExit(f"{model} holds none of the contexts {contexts}; ask for shorter ones")
        suffix = served["rows"][0]["suffix"]
        ran = [s["context"] for s in served["rows"]]
        say(f"{model}: the scripted pair at {ran} tokens, {repeats}× each")
        scripted = {int(r["context"]): r for r in measure(model, ran, suffix, repeats, threads)}
        rows += [served_row(model, s, scripted[s["context"]]) for s in served["rows"]]
        deployments[model] = {k: v for k, v in served.items() if k != "rows"} | {"suffix": suffix, "contexts": ran}
    out = output_dir(HERE, args.quick, "served")
    write_csv(out / "served.csv", rows)
    write_meta(
        out,
        models=models,
        contexts=contexts,
        repeats=repeats,
        threads=threads,
        capacity_mib=capacity_mib,
        deployments=deployments,
    )
    if not args.quick:
        replace_section(HERE / "README.md", "served", served_table(rows))
    summary = {
        "served_over_scripted_max": max(r["served_over_scripted"] for r in rows),
        "served_over_bound_max": max(r["served_over_bound"] for r in rows),
        "rows": [
            {
                k: r[k]
                for k in (
                    "model",
                    "context",
                    "decision",
                    "served_s",
                    "ours_s",
                    "served_over_scripted",
                    "served_over_bound",
                    "served_omega_s",
                    "served_dense_over_served",
                )
            }
            for r in rows
        ],
    }
    print(json.dumps(summary) if args.json else served_table(rows))


def served_row(model: str, served: dict[str, Any], scripted: dict[str, Any]) -> dict[str, Any]:
    """One context: the served timings beside the scripted pair's, and their ratios; the
    served bound is the scripted one's, from the served run's own parts: the suffix's prefill
    on the replica (its ``prefill`` phase, to the first token) + the bytes it received ÷ the raw
    UCX bandwidth the scripted pair measured in the same run; Ω = served − bound (deciding, Ray
    calls, the receive beyond raw speed, rebuilding the cache)."""
    ours = float(scripted["ours_s"])
    raw = float(scripted["raw_bandwidth_bytes_per_s"])
    bound = physical_bound(served["served_prefill_s"], served["served_bytes"], raw)
    return {
        "model": model,
        **served,
        "ours_s": ours,
        "local_s": float(scripted["local_s"]),
        "dense_s": float(scripted["dense_s"]),
        "raw_bandwidth_bytes_per_s": raw,
        "served_bound_s": bound,
        "served_omega_s": served["served_s"] - bound,
        "served_over_bound": served["served_s"] / bound,
        "served_over_scripted": served["served_s"] / ours,
        "served_replica_over_scripted": served["served_replica_s"] / ours,
        "served_dense_over_served": served["served_dense_s"] / served["served_s"],
    }


def served_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | context | suffix | decision | served s | replica-side s | receive s | prefill s | decide ms "
        "| bound s | served ÷ bound | Ω ms | scripted transfer s | served ÷ scripted | served dense s "
        "| served dense ÷ served |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['context']} | {r['suffix']} | {r['decision']} | {float(r['served_s']):.3f} "
            f"| {float(r['served_replica_s']):.3f} | {float(r['served_receive_s']):.3f} "
            f"| {float(r['served_prefill_s']):.3f} | {float(r['served_decide_s']) * 1e3:.1f} "
            f"| {float(r['served_bound_s']):.3f} | {float(r['served_over_bound']):.2f} "
            f"| {float(r['served_omega_s']) * 1e3:.1f} "
            f"| {float(r['ours_s']):.3f} | {float(r['served_over_scripted']):.2f} "
            f"| {float(r['served_dense_s']):.3f} | {float(r['served_dense_over_served']):.1f} |"
        )
    lines.append(
        "\nBound = the suffix's prefill on the replica + the bytes received ÷ the raw UCX bandwidth the "
        "scripted pair measured in the same run (one plain 64 MiB message; GB/s: "
        + raw_bandwidths(rows)
        + "); Ω = served − bound."
    )
    return "\n".join(lines)


def _publish(rows: list[dict[str, Any]], results: Path, as_json: bool) -> None:
    stored = read_csv(results / "ttft.csv")
    summary = summarize(rows)
    (results / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(stored, results / "ttft.png")
    if results == output_dir(HERE, False):
        replace_section(HERE / "README.md", "table", table(stored))
    print(json.dumps(summary) if as_json else table(stored))


if __name__ == "__main__":
    main()
