"""The top-level README's "Results" section, generated from the studies' committed served runs.

``python -m experiments.results`` rewrites the text between ``<!-- BEGIN results -->`` and
``<!-- END results -->`` in ``README.md``. Every table comes from a study's ``results/served/``
(``connect()`` → executor → replica actors → manager → transport) and names the command that
measured it and the commit its ``meta.json`` records; the scripted microbenchmarks stay on the
studies' own pages. Nothing is measured here.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.common import read_csv, replace_section
from graphflow.bench.multi_agent import MultiAgentReport, MultiAgentRow
from graphflow.bench.systems import PREFIX_CACHING

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).parent
MIB = 1 << 20


def _ttft(folder: Path) -> list[str]:
    out = [
        "| model | context | agent prompt tokens | decision | bytes moved | ours (served) s | dense (served) s "
        "| dense ÷ ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in read_csv(folder / "served.csv"):
        out.append(
            f"| {r['model']} | {r['context']} | {r['suffix']} | {r['decision']} | {int(r['served_bytes']):,} "
            f"| {float(r['served_s']):.3f} | {float(r['served_dense_s']):.2f} "
            f"| {float(r['served_dense_over_served']):.1f} |"
        )
    return out


def _best_caching(
    by: dict[tuple[int, str], MultiAgentRow], k: int, key: Callable[[MultiAgentRow], float], digits: int = 2
) -> str:
    """The prefix-caching baseline with the least ``key`` at ``k``: its value and its name."""
    ran = [(key(by[k, s]), s) for s in PREFIX_CACHING if (k, s) in by]
    return "—" if not ran else f"{min(ran)[0]:.{digits}f} ({min(ran)[1]})"


def _multi_agent(folder: Path) -> list[str]:
    got = MultiAgentReport.from_json(json.loads((folder / "bench_multi_agent.json").read_text()))
    by = {(r.agents, r.system): r for r in got.rows}
    caching = got.prefix_caching_over_ours
    out = [
        "| agents | ours s | ideal s | ideal ÷ ours | dense s | best prefix caching s | it ÷ ours |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in sorted({r.agents for r in got.rows}):
        ours = by[k, "ours"]
        ideal, dense = by.get((k, "ideal")), by.get((k, "dense"))
        out.append(
            f"| {k} | {ours.makespan_s:.2f} | {f'{ideal.makespan_s:.2f}' if ideal else '—'} "
            f"| {f'{got.efficiency[k]:.3f}' if k in got.efficiency else '—'} "
            f"| {f'{dense.makespan_s:.2f}' if dense else '—'} | {_best_caching(by, k, lambda r: r.makespan_s)} "
            f"| {f'{caching[k]:.2f}' if k in caching else '—'} |"
        )
    return out


def _peak_memory(folder: Path) -> list[str]:
    got = MultiAgentReport.from_json(json.loads((folder / "bench_peak_memory.json").read_text()))
    by = {(r.agents, r.system): r for r in got.rows}
    over = got.memory_over_dense.get("ours", {})
    out = [
        "| agents | ours MiB | dense MiB | least prefix caching MiB | ours ÷ dense |",
        "|---|---|---|---|---|",
    ]
    for k in sorted({r.agents for r in got.rows}):
        dense = by.get((k, "dense"))
        least = _best_caching(by, k, lambda r: r.peak_rss_growth_bytes / MIB, 0)
        out.append(
            f"| {k} | {by[k, 'ours'].peak_rss_growth_bytes / MIB:.0f} "
            f"| {f'{dense.peak_rss_growth_bytes / MIB:.0f}' if dense else '—'} | {least} "
            f"| {f'{over[k]:.2f}' if k in over else '—'} |"
        )
    return out


def _throughput(folder: Path) -> list[str]:
    rows = json.loads((folder / "bench_serve.json").read_text())["rows"]
    tps: dict[tuple[int, str, bool], float] = {
        (r["workflows"], r.get("system", "ours"), r["batching"]): r["tokens_per_s"] for r in rows
    }
    out = [
        "| workflows | ours tok/s | ours unbatched tok/s | dense tok/s | best prefix caching tok/s "
        "| ours ÷ dense | ours ÷ best prefix caching |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in sorted({r["workflows"] for r in rows}):
        ours, dense = tps[w, "ours", True], tps.get((w, "dense", True))
        ran = [(tps[w, s, True], s) for s in PREFIX_CACHING if (w, s, True) in tps]
        best = max(ran) if ran else None
        unbatched = tps.get((w, "ours", False))
        out.append(
            f"| {w} | {ours:.1f} | {f'{unbatched:.1f}' if unbatched else '—'} "
            f"| {f'{dense:.1f}' if dense else '—'} | {'{:.1f} ({})'.format(*best) if best else '—'} "
            f"| {f'{ours / dense:.2f}' if dense else '—'} | {f'{ours / best[0]:.2f}' if best else '—'} |"
        )
    return out


def _ttft_flags(meta: dict[str, Any]) -> str:
    """The models and contexts the TTFT run measured (``--served`` alone measures fewer)."""
    if not meta.get("models") or not meta.get("contexts"):
        return ""
    return f" --models {','.join(meta['models'])} --contexts {','.join(str(c) for c in meta['contexts'])}"


def _peak_memory_flags(meta: dict[str, Any]) -> str:
    return " --from-multi-agent" if "from_multi_agent" in meta else ""


@dataclass(frozen=True, slots=True)
class Study:
    title: str
    name: str  # its folder under experiments/
    result: str  # the file in results/served/ that shows it ran
    command: str
    render: Callable[[Path], list[str]]
    flags: Callable[[dict[str, Any]], str] = lambda meta: ""  # what the run's meta.json says it was given


STUDIES = (
    Study(
        "TTFT of an agent whose upstream state is on another replica",
        "ttft",
        "served.csv",
        "python -m experiments.ttft.run --served",
        _ttft,
        _ttft_flags,
    ),
    Study(
        "k agents over one 4K-token root: makespan",
        "multi_agent",
        "bench_multi_agent.json",
        "python -m experiments.multi_agent.served",
        _multi_agent,
    ),
    Study(
        "k agents over one 4K-token root: the replicas' peak memory growth",
        "peak_memory",
        "bench_peak_memory.json",
        "python -m experiments.peak_memory.served",
        _peak_memory,
        _peak_memory_flags,
    ),
    Study(
        "Generated tokens per second, concurrent workflows (2 agents each over a 1K-token root)",
        "throughput",
        "bench_serve.json",
        "python -m experiments.throughput.served",
        _throughput,
    ),
)


def _provenance(meta: dict[str, Any]) -> str:
    sha = str(meta.get("git_sha", ""))[:7] or "an unrecorded commit"
    tree = "a dirty tree (--allow-dirty)" if meta.get("git_dirty") else "a clean tree"
    source = ""
    if "from_multi_agent" in meta:
        source = f"; reduced from the multi-agent run at {str(meta['from_multi_agent'])[:7]}"
    return f"at {sha} on {tree}{source}"


def section(here: Path = HERE) -> str:
    parts = [
        "Generated by `python -m experiments.results` from the studies' served runs (`results/served/`): "
        "every number was measured on this 2-core CPU machine through `connect()` → executor → replica "
        "actors → manager → UCX, by the command above its table. The baselines ran in the same run as "
        "ours; the targets, AAFLOW+'s published figures and the scripted microbenchmarks are on each "
        "study's page."
    ]
    for s in STUDIES:
        folder = here / s.name / "results" / "served"
        if not (folder / s.result).exists():
            parts.append(f"**{s.title}** — not measured yet through the served path (`{s.command}`).")
            continue
        meta = json.loads((folder / "meta.json").read_text())
        command = s.command + s.flags(meta)
        parts.append(
            f"**{s.title}** (`{command}`, {_provenance(meta)}; [details](experiments/{s.name}/README.md))\n\n"
            + "\n".join(s.render(folder))
        )
    return "\n\n".join(parts)


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    replace_section(ROOT / "README.md", "results", section())
    print(section())


if __name__ == "__main__":
    main()
