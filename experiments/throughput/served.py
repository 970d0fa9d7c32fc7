"""The served benchmark (``graphflow bench serve``) at the issue's sizes, with provenance.

``python -m experiments.throughput.served [--quick] [--json]`` runs
:func:`graphflow.bench.serve.run_serve_bench` (embedded Ray, the served path end to end,
batching on and off in the same run, plus the scripted agents job for comparison) and writes
``results/served/bench_serve.json``, ``meta.json`` and the README's served table. ``--quick``
(tiny sizes, a random tiny model) writes under ``out/quick-served/`` and never touches
committed results.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from experiments.common import progress, publish_served, served_args
from graphflow.bench.serve import run_serve_bench
from graphflow.bench.serve_report import ServeReport, calibration_line
from graphflow.runtime.batch_limits import MAX_BATCH_TOKENS

HERE = Path(__file__).parent
FULL = {
    "model": "smollm2-135m",
    "workflows": (1, 4, 16),
    "root_tokens": 1024,
    "agents": 2,
    "decode": 32,
    "memory_agents": 16,
    "memory_root": 4096,
    "hol_prefill": 4096,
    "threads": 1,
    "max_batch_tokens": MAX_BATCH_TOKENS,
    "baselines": ("dense", "local", "routed", "holder"),
}
QUICK = {
    **FULL,
    "model": "tiny-llama",
    "workflows": (1, 4),
    "root_tokens": 256,
    "decode": 8,
    "memory_agents": 4,
    "memory_root": 512,
    "hol_prefill": 1024,
}


def table(result: ServeReport, settings: dict[str, Any]) -> str:
    head = "| system | batching | workflows | agents | tok/s | TTFT p50 s | TTFT p99 s "
    lines = [
        head + "| replicas' peak RSS growth MiB¹ | KV MiB | rows per engine step | cores: replicas / other² |",
        "|---" * 11 + "|",
    ]
    for r in result.rows:
        per_step = f"{r.rows_per_step:.1f}" if r.batching else "—"
        lines.append(
            f"| {r.system} | {'on' if r.batching else 'off'} | {r.workflows} | {r.agents} "
            f"| {r.tokens_per_s:.1f} | {r.ttft_p50_s:.2f} | {r.ttft_p99_s:.2f} "
            f"| {r.peak_rss_bytes / 2**20:.0f} | {r.kv_bytes / 2**20:.0f} | {per_step} "
            f"| {r.replica_cores:.2f} / {r.other_cores:.2f} |"
        )
    lines.append("")
    lines.append(
        "¹ From the same workload run again in a trial of its own after every timed trial (measuring "
        "peak growth hands freed memory back to the OS first, so it is not timed); the timed trials "
        "run in steady state after a full-size warm-up."
    )
    lines.append(
        "² CPU seconds over the trial's wall time: the replicas' processes, and everything else on the "
        "host (the client driving the workflows, Ray's processes, the OS), from /proc/stat "
        "(`graphflow/bench/host_cpu.py`); the host has "
        f"{os.cpu_count()} cores."
    )
    lines.append("")
    speedups = ", ".join(f"{w} workflows {x:.2f}×" for w, x in result.speedup_vs_unbatched.items())
    lines.append(f"Batched over unbatched tokens/s, same run: {speedups}.")
    for system in sorted({r.system for r in result.rows} - {"ours"}):
        over = ", ".join(f"{w} workflows {x:.2f}×" for w, x in result.ours_over(system).items())
        lines.append(f"Ours over {system} (batched tokens/s, same run): {over}.")
    caching = ", ".join(f"{w} workflows {x:.2f}×" for w, x in result.ours_over_prefix_caching.items())
    if caching:
        lines.append(f"Ours over the better prefix-caching baseline: {caching}.")
    top = result.batched(max(settings["workflows"]))
    if result.scripted_tokens_per_s is not None and top is not None:
        lines.append(
            f"The scripted agents job (`graphflow/bench/agents.py`, not the served path) on the same "
            f"workload at {top.workflows} workflows, same run: {result.scripted_tokens_per_s:.1f} tok/s "
            f"(served batched: {top.tokens_per_s:.1f})."
        )
    lines.extend(calibration_line(c) for c in result.calibrations)
    for m in result.memory:
        mode = "reuse, shared root" if m.reuse else "reuse off (dense)"
        lines.append(
            f"* {m.agents} agents over one {m.root_tokens}-token root, batching "
            f"{'on' if m.batching else 'off'}, {mode}: holder's peak RSS growth "
            f"{m.peak_rss_bytes / 2**20:.0f} MiB in {m.wall_s:.1f} s"
        )
    for k, v in result.memory_growth_vs_dense.items():
        lines.append(f"* peak growth over dense's, {k.replace('_', ' ')}: {v:.2f}×")
    for h in result.head_of_line:
        lines.append(
            f"* a short node's TTFT p99, batching {'on' if h.batching else 'off'}: idle "
            f"{h.idle_p99_s:.2f} s, during a {h.prefill_tokens}-token prefill {h.loaded_p99_s:.2f} s "
            f"({h.ratio_p99:.2f}×, {len(h.loaded_ttft_s)} samples, {h.pauses} steps paused for them)"
        )
    lines.append("")
    lines.append(
        f"Model {settings['model']}, {settings['threads']} torch thread per replica, 2 replicas, "
        f"{settings['max_batch_tokens']} tokens per engine step; agent prompts "
        f"{', '.join(map(str, result.agent_prompt_tokens))} tokens, {settings['decode']} generated."
    )
    return "\n".join(lines)


def main() -> None:
    args = served_args(
        __doc__, lambda p: p.add_argument("--no-scripted", action="store_true", help="skip the scripted agents job")
    )
    s = QUICK if args.quick else FULL
    say = progress(args.json)
    result = run_serve_bench(
        s["model"],
        2,
        s["workflows"],
        s["root_tokens"],
        s["agents"],
        s["decode"],
        (True, False),
        s["threads"],
        s["max_batch_tokens"],
        s["memory_agents"],
        s["memory_root"],
        s["hol_prefill"],
        scripted=not args.no_scripted,
        say=say,
        baselines=s["baselines"],
    )
    publish_served(HERE, "bench_serve", result.to_json(), s, table(result, s), args.quick, args.json)


if __name__ == "__main__":
    main()
