"""Peak memory of k agents over one root context, through the served path.

``python -m experiments.peak_memory.served [--quick] [--json] [--from-multi-agent | --memory-price S]
[--allow-dirty]`` runs the multi-agent study's served trials
(:func:`graphflow.bench.multi_agent.run_multi_agent_bench`: embedded Ray, two replicas,
``connect()`` → executor → replica actors → manager → UCX) for ours, dense and the
prefix-caching baselines, and keeps each trial's ``peak_rss_growth_bytes``: the replicas' peak
resident-memory growth over the trial, the root's prefill included, summed
(:class:`graphflow.bench.replica_memory.ReplicaMemory`). ``--from-multi-agent`` reduces the
multi-agent study's committed served run instead (the same trials, so the same numbers, at the
commit its ``meta.json`` names). Writes ``results/served/bench_peak_memory.json``, ``meta.json``
and the README's served table; ``--quick`` writes under ``out/quick-served/``. With
``--memory-price S`` the deployment's placement charges S seconds per GiB of KV an option adds to
a replica (``graphflow serve --memory-price``), and ours runs beside dense and ``holder`` alone (the
systems the price leaves as they are), into ``results/served-priced-<S>/``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from experiments.common import progress, publish_served, served_args
from experiments.multi_agent.served import FULL, QUICK, run
from graphflow.bench.multi_agent import MultiAgentReport
from graphflow.bench.systems import PREFIX_CACHING

HERE = Path(__file__).parent
MULTI_AGENT = HERE.parent / "multi_agent" / "results" / "served"
SYSTEMS = ("ours", "dense", *PREFIX_CACHING)
PRICED = ("ours", "dense", "holder")  # NOTE: routed is placed by the scheduler too, so a price would change it
MIB = 1 << 20


def table(result: MultiAgentReport, settings: dict[str, Any], source: str) -> str:
    over = result.memory_over_dense
    lines = [
        "| agents | system | replicas' peak RSS growth MiB | ÷ dense | makespan s | bytes moved |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted((r for r in result.rows if r.system in SYSTEMS), key=lambda r: (r.agents, SYSTEMS.index(r.system))):
        ratio = over.get(r.system, {}).get(r.agents)
        lines.append(
            f"| {r.agents} | {r.system} | {r.peak_rss_growth_bytes / MIB:.0f} "
            f"| {'—' if ratio is None else f'{ratio:.2f}'} | {r.makespan_s:.2f} | {r.bytes_moved:,} |"
        )
    lines += [
        "",
        f"Model {settings['model']}, {settings['root_tokens']}-token root, {settings['decode']} tokens per "
        f"agent, {result.threads} torch thread per replica, 2 replicas, KV over {result.transport}"
        + (f", placement charging {result.memory_price:g} s per GiB of new KV" if result.memory_price else "")
        + f"; {source}.",
    ]
    return "\n".join(lines)


def _from_multi_agent() -> tuple[MultiAgentReport, dict[str, Any]]:
    path = MULTI_AGENT / "bench_multi_agent.json"
    if not path.is_file():
        raise SystemExit(f"{path} not found: run python -m experiments.multi_agent.served first")
    result = MultiAgentReport.from_json(json.loads(path.read_text()))
    if not any(r.peak_rss_growth_bytes for r in result.rows):
        raise SystemExit(
            f"{path} has no memory figures (timed in steady state, or older): "
            "run python -m experiments.peak_memory.served without --from-multi-agent"
        )
    meta = json.loads((MULTI_AGENT / "meta.json").read_text())
    return result, meta


def main() -> None:
    def options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--from-multi-agent", action="store_true", help="reduce the multi-agent study's committed served run"
        )
        p.add_argument(
            "--memory-price",
            type=float,
            default=0.0,
            help="seconds placement charges per GiB of new KV; runs ours, dense and holder "
            "into results/served-priced-S/",
        )

    args = served_args(__doc__, options)
    if args.memory_price and args.from_multi_agent:
        raise SystemExit("--memory-price runs trials of its own; leave out --from-multi-agent")
    s = {**(QUICK if args.quick else FULL), "memory": True, "memory_price": args.memory_price}
    say = progress(args.json)
    if args.from_multi_agent:
        result, meta = _from_multi_agent()
        s = {k: meta.get(k, v) for k, v in FULL.items()} | {"memory": True}  # the settings that run had
        source = f"the multi-agent study's served trials at {meta['git_sha'][:7]} (`results/served/` there)"
        settings = {**s, "systems": SYSTEMS, "from_multi_agent": meta["git_sha"]}
    else:
        systems = PRICED if args.memory_price else SYSTEMS
        result = run(s, systems, say)
        source = "trials of its own"
        settings = {**s, "systems": systems}
    sub = f"served-priced-{args.memory_price:g}" if args.memory_price else "served"
    publish_served(
        HERE, "bench_peak_memory", result.to_json(), settings, table(result, s, source), args.quick, args.json, sub
    )


if __name__ == "__main__":
    main()
