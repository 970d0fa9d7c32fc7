"""Peak KV memory of k agents sharing one root context, per system, measured.

``python -m experiments.peak_memory.run [--model smollm2-135m] [--root-tokens 4096]
[--agents 1,2,4,8,16] [--from-multi-agent] [--quick] [--json] [--report]``

The same workloads as the multi-agent study (``graphflow/bench/agents.py``). Per system and
k, summed over both replicas: the KV each system keeps in ``BlockStore``s (real tensor bytes:
dense and text keep one store per agent; local reuse and ours one store per replica holding the
root once and each agent's private blocks), the root bytes among them, the working batch
cache, and each process's RSS growth during the timed part (``VmHWM`` after a reset, minus the
RSS at the start). ``--from-multi-agent`` reduces the multi-agent study's recorded trials instead
of running the job again (the same job, so the same numbers). Writes ``results/peak_memory.csv``,
``meta.json``, ``results/peak_memory.png`` and the README table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from experiments.agents_job import SYSTEM_LABELS, reduce, run_agents
from experiments.common import (
    add_provenance,
    guard_tree,
    output_dir,
    read_csv,
    replace_section,
    write_csv,
    write_meta,
)
from experiments.peak_memory.plot import plot

HERE = Path(__file__).parent
MULTI_AGENT = HERE.parent / "multi_agent"
PUBLISHED = "AAFLOW+ reports 1.72–6.46× less peak KV memory than its baselines (published, modeled in their code)"
MIB = 1 << 20


def memory_rows(rows: list[dict[str, Any]], root_bytes: int) -> list[dict[str, Any]]:
    """Memory columns per (k, system), with ours' check: the roots held once per replica that
    runs agents (no duplicated prefix) and everything else private."""
    dense = {int(r["agents"]): float(r["stored_bytes"]) for r in rows if r["system"] == "dense"}
    out = []
    for r in rows:
        k, stored, shared = int(r["agents"]), float(r["stored_bytes"]), float(r["shared_bytes"])
        replicas = 1 if r["system"] == "local_holder" or k == 1 else 2
        out.append(
            {
                "agents": k,
                "system": r["system"],
                "stored_bytes": int(stored),
                "shared_bytes": int(shared),
                "private_bytes": int(stored - shared),
                "working_bytes": int(float(r["working_bytes"])),
                "rss_growth_bytes": int(float(r["rss_growth_bytes"])),
                "rss_peak_bytes": int(float(r["rss_peak_bytes"])),
                "stored_over_dense": stored / dense[k] if k in dense else "",
                "roots_held_once": "" if r["system"] in ("dense", "text") else shared == replicas * root_bytes,
            }
        )
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ours = {int(r["agents"]): r for r in rows if r["system"] == "ours"}
    dense = {int(r["agents"]): r for r in rows if r["system"] == "dense"}
    top = max(ours)
    return {
        "peak_memory_ratio_vs_dense_k16": (
            float(ours[16]["stored_bytes"]) / float(dense[16]["stored_bytes"]) if 16 in ours and 16 in dense else None
        ),
        "largest_k": top,
        "stored_ratio_vs_dense": float(ours[top]["stored_bytes"]) / float(dense[top]["stored_bytes"]),
        "rss_growth_ratio_vs_dense": (
            float(ours[top]["rss_growth_bytes"]) / max(1.0, float(dense[top]["rss_growth_bytes"]))
        ),
        "working_ratio_vs_dense": float(ours[top]["working_bytes"]) / float(dense[top]["working_bytes"]),
        "ours_roots_held_once": all(str(r["roots_held_once"]) == "True" for r in ours.values()),
    }


def table(rows: list[dict[str, str]]) -> str:
    lines = [
        "| k | system | stored KV MiB | of it root MiB | private MiB | stored ÷ dense | working cache MiB "
        "| RSS growth MiB | root held once per replica |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (int(r["agents"]), list(SYSTEM_LABELS).index(r["system"]))):
        ratio = f"{float(r['stored_over_dense']):.3f}" if r["stored_over_dense"] else ""
        lines.append(
            f"| {r['agents']} | {SYSTEM_LABELS[r['system']]} | {int(r['stored_bytes']) / MIB:.1f} "
            f"| {int(r['shared_bytes']) / MIB:.1f} | {int(r['private_bytes']) / MIB:.1f} | {ratio} "
            f"| {int(r['working_bytes']) / MIB:.1f} | {int(r['rss_growth_bytes']) / MIB:.1f} "
            f"| {r['roots_held_once']} |"
        )
    lines.append(f"\n{PUBLISHED}.")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--root-tokens", type=int, default=4096)
    p.add_argument("--agents", default="1,2,4,8,16")
    p.add_argument("--suffix", type=int, default=64)
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--from-multi-agent", action="store_true", help="reduce experiments/multi_agent's recorded trials")
    p.add_argument("--quick", action="store_true", help="512-token root, k = 1, 2, 4, 8 tokens (≤ 60 s)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.add_argument("--report", action="store_true", help="only regenerate table, plot and summary from the CSV")
    add_provenance(p)
    args = p.parse_args()
    guard_tree(args.allow_dirty, args.quick)
    results = output_dir(HERE, args.quick)
    if args.report:
        _publish(read_csv(results / "peak_memory.csv"), results, args.json)
        return
    if args.from_multi_agent:
        trials: list[dict[str, Any]] = read_csv(MULTI_AGENT / "results" / "trials.csv")
        meta = json.loads((MULTI_AGENT / "meta.json").read_text())
        job, source = meta["job"], "experiments/multi_agent (same job, its recorded trials)"
        settings = {k: meta[k] for k in ("model", "root_tokens", "agents", "suffix", "decode", "quick")}
    else:
        if args.quick:
            args.root_tokens, args.agents, args.suffix, args.decode = 512, "1,2,4", 32, 8
        ks = [int(k) for k in args.agents.split(",")]
        if min(ks) < 1 or min(args.root_tokens, args.suffix, args.decode) < 1:
            raise SystemExit("--agents, --root-tokens, --suffix and --decode must all be at least 1")
        trials, job = run_agents(
            args.model, args.root_tokens, [(1, k) for k in ks], suffix=args.suffix, decode=args.decode, repeats=1
        )
        source = "this run"
        settings = {
            "model": args.model,
            "root_tokens": args.root_tokens,
            "agents": ks,
            "suffix": args.suffix,
            "decode": args.decode,
            "quick": args.quick,
        }
    rows = memory_rows(reduce(trials), int(job["root_bytes"]))
    write_csv(results / "peak_memory.csv", rows)
    write_meta(
        results if args.quick else HERE,
        **settings,
        source=source,
        root_bytes=job["root_bytes"],
        backend="ucx",
        replicas=2,
    )
    _publish(rows, results, args.json)


def _publish(rows: list[dict[str, Any]], results: Path, as_json: bool) -> None:
    stored = read_csv(results / "peak_memory.csv")
    summary = summarize(stored)  # type: ignore[arg-type]
    (results / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(stored, results / "peak_memory.png")
    if results == output_dir(HERE, False):
        replace_section(HERE / "README.md", "table", table(stored))
    print(json.dumps(summary) if as_json else table(stored))


if __name__ == "__main__":
    main()
