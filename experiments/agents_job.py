"""Run the two-replica agents job (``graphflow/bench/agents.py``) and reduce its trials.

The multi-agent, peak-memory and throughput studies all run this one job on different
workloads; this module launches it, writes the raw trials and reduces them to one row per
(workload, system): medians over repeats of the measured columns.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.common import (
    add_provenance,
    guard_tree,
    output_dir,
    read_csv,
    replace_section,
    save_figure,
    write_csv,
    write_meta,
)
from graphflow.bench.agents import AgentsPlan
from graphflow.harness.launch import run_two_processes

__all__ = ["SYSTEM_LABELS", "Study", "by_system", "ideal_s", "reduce", "run_agents", "same_tokens", "study_main"]

SYSTEM_LABELS = {
    "dense": "dense",
    "text": "text replay",
    "local": "local reuse (round robin)",
    "local_holder": "local reuse (all on holder)",
    "ours": "scripted transfer",  # the two-process microbenchmark, not the served system
}
_SUMMED = ("stored_bytes", "shared_bytes", "working_bytes", "rss_growth_bytes")


def run_agents(
    model: str,
    root_tokens: int,
    workloads: Sequence[tuple[int, int]],
    *,
    suffix: int,
    decode: int,
    repeats: int,
    systems: Sequence[str] = tuple(SYSTEM_LABELS),
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """All trials (A's rows, both replicas' columns) and A's metadata (root prefill time, …)."""
    plan = AgentsPlan(model, root_tokens, list(workloads), suffix, decode, tuple(systems), repeats)
    job = [*plan.args(), "--timeout", "1800"]
    holder, _ = run_two_processes("ucx", job, timeout_s=4 * 3600)
    meta = {k: v for k, v in holder.items() if k != "trials"}
    return holder["trials"], meta


def by_system(rows: Sequence[Mapping[str, Any]], key: str) -> dict[int, dict[str, Any]]:
    """Reduced rows grouped by the workload column ``key`` ("agents", "roots"), then by system."""
    out: dict[int, dict[str, Any]] = {}
    for r in rows:
        out.setdefault(int(r[key]), {})[str(r["system"])] = r
    return out


def plot_by_system(
    rows: Sequence[Mapping[str, Any]],
    key: str,
    metric: str,
    png: Path,
    *,
    xlabel: str,
    ylabel: str,
    ideal: bool = False,
) -> None:
    """One log-log line per system of ``metric`` against ``key`` (plus ours' ideal when asked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    groups = by_system(rows, key)
    xs = sorted(groups)
    for s in SYSTEM_LABELS:
        if all(s in groups[x] for x in xs):
            ax.plot(xs, [float(groups[x][s][metric]) for x in xs], "-o", label=SYSTEM_LABELS[s])
    if ideal:
        ax.plot(xs, [float(groups[x]["ours"]["ideal_s"]) for x in xs], ":", color="black", label="ideal")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    save_figure(fig, png)


def ideal_s(row: dict[str, Any]) -> float:
    """The ideal for an ``ours`` trial: the shared root computed once (already, upstream) and
    transfers free — each replica only rebuilds its batch cache and runs its agents; the later
    replica sets the time."""
    return max(float(row[f"{s}_rebuild_s"]) + float(row[f"{s}_agents_s"]) for s in ("a", "b"))


def reduce(trials: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (roots, agents per root, system): medians over repeats."""
    groups: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for t in trials:
        groups.setdefault((int(t["roots"]), int(t["agents_per_root"]), str(t["system"])), []).append(t)
    rows = []
    for (roots, per_root, system), ts in sorted(groups.items()):

        def med(key: str, ts: list[dict[str, Any]] = ts) -> float:
            return statistics.median(float(t[key]) for t in ts)

        row: dict[str, Any] = {
            "roots": roots,
            "agents_per_root": per_root,
            "agents": roots * per_root,
            "system": system,
            "repeats": len(ts),
            "makespan_s": med("makespan_s"),
            "generated_tokens": int(ts[0]["generated_tokens"]),
        }
        row["tokens_per_s"] = row["generated_tokens"] / row["makespan_s"]
        row["replica_busy_s"] = med("a_busy_s") + med("b_busy_s")
        for part in ("prefill_s", "transfer_s", "rebuild_s", "agents_s"):
            row[part] = max(med(f"a_{part}"), med(f"b_{part}"))
        for key in _SUMMED:
            row[key] = med(f"a_{key}") + med(f"b_{key}")
        row["rss_peak_bytes"] = max(med("a_rss_peak_bytes"), med("b_rss_peak_bytes"))
        row["ideal_s"] = statistics.median(ideal_s(t) for t in ts) if system == "ours" else ""
        rows.append(row)
    return rows


def same_tokens(trials: Sequence[dict[str, Any]], system: str, reference: str) -> float:
    """Fraction of agents whose generated tokens under ``system`` equal those under ``reference``
    (same workload, first repeat)."""

    def tokens(name: str) -> dict[tuple[int, int], Any]:
        return {
            (int(t["roots"]), int(t["agents_per_root"])): json.loads(t["tokens"])
            for t in trials
            if t["system"] == name and int(t["repeat"]) == 0
        }

    got, ref = tokens(system), tokens(reference)
    same = total = 0
    for key, sides in got.items():
        if key not in ref or system == "local_holder" or reference == "local_holder":
            continue
        for mine, theirs in zip(sides, ref[key], strict=True):
            for x, y in zip(mine, theirs, strict=True):
                same += x == y
                total += 1
    return same / total if total else float("nan")


@dataclass(frozen=True, slots=True)
class Study:
    """One study on the agents job: its folder, its workloads and how it reports them."""

    folder: Path
    name: str  # stem of the reduced CSV and the PNG
    counts: str  # the command-line list that sets the workloads: "agents" or "workflows"
    counts_default: str
    root_default: int
    quick: tuple[int, str, int, int]  # root tokens, counts, suffix, decode
    workloads: Callable[[list[int]], list[tuple[int, int]]]
    summarize: Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]]
    table: Callable[[list[dict[str, str]], dict[str, Any]], str]
    plot: Callable[[list[dict[str, str]], Path], None]


def study_main(study: Study, doc: str | None) -> None:
    """The command line every agents-job study shares: run (or ``--report`` from the recorded
    trials), write trials, reduced CSV, meta, plot, README table and summary."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--root-tokens", type=int, default=study.root_default)
    p.add_argument(f"--{study.counts}", default=study.counts_default)
    p.add_argument("--suffix", type=int, default=64, help="each agent's own prompt tokens")
    p.add_argument("--decode", type=int, default=32, help="tokens each agent produces")
    p.add_argument("--repeats", type=int, default=1)
    root, counts, suffix, decode = study.quick
    p.add_argument(
        "--quick", action="store_true", help=f"{root}-token roots, {study.counts} {counts}, {decode} tokens (≤ 60 s)"
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.add_argument("--report", action="store_true", help="only regenerate table, plot and summary from the CSVs")
    add_provenance(p)
    args = p.parse_args()
    guard_tree(args.allow_dirty, args.quick)
    results = output_dir(study.folder, args.quick)
    meta_folder = results if args.quick else study.folder
    if args.report:
        meta = json.loads((meta_folder / "meta.json").read_text()).get("job", {})
        _publish(study, read_csv(results / "trials.csv"), meta, args.json, results)
        return
    if args.quick:
        args.root_tokens, suffix_counts, args.suffix, args.decode = root, counts, suffix, decode
        setattr(args, study.counts, suffix_counts)
    ns = [int(n) for n in getattr(args, study.counts).split(",")]
    if min(ns) < 1 or min(args.root_tokens, args.suffix, args.decode, args.repeats) < 1:
        raise SystemExit(f"--{study.counts}, --root-tokens, --suffix, --decode and --repeats must all be at least 1")
    if not args.json:
        print("two replica processes; the full run takes 10–25 minutes on a 2-core machine, --quick under one")
        print(f"{args.model}: {args.root_tokens}-token roots, {study.counts} {ns}, {args.decode} tokens per agent")
    trials, meta = run_agents(
        args.model, args.root_tokens, study.workloads(ns), suffix=args.suffix, decode=args.decode, repeats=args.repeats
    )
    write_csv(results / "trials.csv", trials)
    write_meta(
        meta_folder,
        model=args.model,
        root_tokens=args.root_tokens,
        **{study.counts: ns},
        suffix=args.suffix,
        decode=args.decode,
        repeats=args.repeats,
        quick=args.quick,
        backend="ucx",
        replicas=2,
        job=meta,
    )
    _publish(study, trials, meta, args.json, results)


def _publish(study: Study, trials: list[dict[str, Any]], meta: dict[str, Any], as_json: bool, results: Path) -> None:
    """Reduced CSV, summary, plot and table into ``results``; the README's table only from a
    full run's results (``output_dir``)."""
    rows = reduce(trials)
    write_csv(results / f"{study.name}.csv", rows)
    stored = read_csv(results / f"{study.name}.csv")
    summary = study.summarize(rows, trials)
    (results / "summary.json").write_text(json.dumps(summary, indent=2))
    study.plot(stored, results / f"{study.name}.png")
    if results == output_dir(study.folder, False):
        replace_section(study.folder / "README.md", "table", study.table(stored, meta))
    print(json.dumps(summary) if as_json else study.table(stored, meta))
