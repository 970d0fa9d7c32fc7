"""The multi-agent study through the served path, beside an ideal measured on its own.

``python -m experiments.multi_agent.served [--quick] [--json] [--allow-dirty] [--systems S,…] [--repeats N]`` runs
:func:`graphflow.bench.multi_agent.run_multi_agent_bench` (``graphflow bench multi-agent``:
embedded Ray, two replicas, ``connect()`` → executor → replica actors → manager → UCX) and
writes ``results/served/bench_multi_agent.json``, ``meta.json`` and the README's served table.
``--quick`` (a random tiny model, small sizes) writes under ``out/quick-served/`` and never
touches committed results. ``--systems`` and ``--repeats`` run a subset, several trials per row
(the systems taking turns), into ``results/served-<systems>[-x<N>]/`` and that section of the
README. The trials are timed with the replicas in steady state: peak memory, whose measurement
hands each replica's freed memory back to the OS before every trial (and so puts every trial's
transfer into fresh pages), is measured in the peak-memory study's own trials.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.common import progress, publish_served, served_args
from graphflow.bench.multi_agent import SYSTEMS, MultiAgentReport, check_request, run_multi_agent_bench
from graphflow.bench.serve_report import calibration_line

HERE = Path(__file__).parent
FULL = {
    "model": "smollm2-135m",
    "agents": (1, 2, 4, 8, 16),
    "root_tokens": 4096,
    "decode": 32,
    "threads": 1,
    "repeats": 1,
    "memory": False,  # timed in steady state; peak memory is experiments/peak_memory's own trials
}
QUICK = {**FULL, "model": "tiny-llama", "agents": (1, 4), "root_tokens": 512, "decode": 6}


def table(result: MultiAgentReport, settings: dict[str, Any]) -> str:
    repeated = any(len(r.makespans_s) > 1 for r in result.rows)
    lines = [
        "| agents | system | root prefill s | agents s | makespan s | bytes moved | decisions |"
        + (" every repeat's makespan s |" if repeated else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if repeated else ""),
    ]
    for r in result.rows:
        decided = ", ".join(f"{k} {v}" for k, v in sorted(r.decisions.items()))
        lines.append(
            f"| {r.agents} | {r.system} | {r.root_prefill_s:.2f} | {r.agents_s:.2f} "
            f"| {r.makespan_s:.2f} | {r.bytes_moved:,} | {decided} |"
            + (f" {' / '.join(f'{m:.2f}' for m in r.makespans_s)} |" if repeated else "")
        )
    head = "| agents | ideal ÷ ours (efficiency) | agents' part only | dense ÷ ours | better prefix caching ÷ ours |"
    lines += ["", head, "|---|---|---|---|---|"]
    agents_only, dense_over, caching = (
        result.efficiency_agents_only,
        result.dense_over_ours,
        result.prefix_caching_over_ours,
    )
    efficiency = result.efficiency

    def cell(ratios: dict[int, float], k: int, digits: int) -> str:
        return f"{ratios[k]:.{digits}f}" if k in ratios else "—"

    for k in sorted({*efficiency, *dense_over, *caching}):
        lines.append(
            f"| {k} | {cell(efficiency, k, 3)} | {cell(agents_only, k, 3)} | {cell(dense_over, k, 2)} "
            f"| {cell(caching, k, 2)} |"
        )
    lines += [
        "",
        f"Model {settings['model']}, {settings['root_tokens']}-token root, {settings['decode']} tokens per "
        f"agent, {result.threads} torch thread per replica, 2 replicas, KV over {result.transport}"
        + (
            f"; {settings['repeats']} trials per row, the systems taking turns, the median makespan's kept"
            if repeated
            else ""
        )
        + (
            "; each trial's peak memory measured (freed memory handed back to the OS before it)."
            if settings.get("memory", True)
            else "; timed in steady state (the replicas keep the memory they freed, receive buffers included, "
            "between trials; peak memory is `experiments/peak_memory`'s own trials)."
        ),
    ]
    if result.calibration:
        lines += ["", calibration_line(result.calibration)]
    return "\n".join(lines)


def run(s: dict[str, Any], systems: tuple[str, ...], say: Callable[[str], None]) -> MultiAgentReport:
    """The trials of settings ``s`` (``FULL``, ``QUICK`` or a variant) for ``systems``."""
    return run_multi_agent_bench(
        s["model"],
        s["agents"],
        s["root_tokens"],
        s["decode"],
        s["threads"],
        s["repeats"],
        say=say,
        systems=systems,
        memory=s["memory"],
        memory_price=s.get("memory_price", 0.0),
    )


def main() -> None:
    def options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--systems", default="", help="run only these (ours always); writes results/served-<systems>/")
        p.add_argument(
            "--repeats",
            type=int,
            default=FULL["repeats"],
            help="trials per (k, system), the systems taking turns; the median makespan's is kept "
            "(above 1: writes results/served-<systems>-x<repeats>/)",
        )

    args = served_args(__doc__, options)
    s = {**(QUICK if args.quick else FULL), "repeats": args.repeats}
    systems = tuple(dict.fromkeys(["ours", *(x for x in args.systems.split(",") if x)])) if args.systems else SYSTEMS
    try:
        check_request(s["agents"], s["root_tokens"], s["decode"], s["repeats"], systems)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    say = progress(args.json)
    result = run(s, systems, say)
    sub = "served" if systems == SYSTEMS else "served-" + "-".join(systems)
    sub += f"-x{args.repeats}" if args.repeats > 1 else ""
    settings = {**s, "systems": systems}
    publish_served(HERE, "bench_multi_agent", result.to_json(), settings, table(result, s), args.quick, args.json, sub)


if __name__ == "__main__":
    main()
