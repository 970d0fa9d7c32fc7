"""Transfer vs recompute between the served replicas of a deployment.

``graphflow sweep transfer-vs-recompute --address ray://… --contexts …``: for each ordered
replica pair (source holds the context, destination runs the node) and context length, the
node is run through the served path (``bench.served.PinnedAgent``) twice per repeat, each over
a context of its own: once with the transfer forced (the source's blocks cross the pair's link
to the destination, which rebuilds the cache and prefills only the template), once with every
token prefilled on the destination. Both are timed by the destination replica, from its call
starting to its first token (median of the repeats after one warm-up). The predictions are the
policy's for the same node, from the costs ``graphflow serve`` measured on its own grid
(prefill lengths, probe transfers per pair); the policy's choice is what it would have picked
unforced. Recompute does not depend on the source: it is measured once per destination.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from graphflow.bench.served import PinnedAgent
from graphflow.bench.sweep_points import SweepPoint
from graphflow.client import Client
from scheduler.policy import Option

__all__ = ["parse_pairs", "sweep_deployment"]


def parse_pairs(text: str, replicas: Sequence[str]) -> list[tuple[str, str]]:
    """``replica-0:replica-2,…`` (names with or without ``graphflow-``) → ordered pairs; ``""``:
    every ordered pair of the deployment's replicas."""
    if not text:
        return [(a, b) for a in replicas for b in replicas if a != b]
    known = {r: r for r in replicas} | {r.removeprefix("graphflow-"): r for r in replicas}
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        src, _, dst = part.partition(":")
        if src not in known or dst not in known or known[src] == known[dst]:
            raise ValueError(f"a pair is SOURCE:DESTINATION of two replicas of {', '.join(replicas)}, got {part!r}")
        pairs.append((known[src], known[dst]))
    return pairs


def sweep_deployment(
    client: Client,
    model: str,
    contexts: Sequence[int],
    repeats: int,
    pairs: Sequence[tuple[str, str]],
    say: Callable[[str], None] = lambda _m: None,
) -> list[SweepPoint]:
    """Points as the two-process sweep's, plus the pair, its hosts and its measured link."""
    agent = PinnedAgent(client)
    hosts = agent.hosts()
    recompute: dict[tuple[str, int], float] = {}
    for dst in sorted({b for _, b in pairs}):
        for n in contexts:
            say(f"recompute: {n} tokens on {dst}")
            runs = [agent.run(n, dst) for _ in range(repeats + 1)][1:]  # the first is a warm-up
            recompute[(dst, n)] = statistics.median(r.trace.ttft_s for r in runs)
    rows = []
    for src, dst in pairs:
        link = client.executor.links.link(src, dst)
        for n in contexts:
            say(f"transfer: {n} tokens {src} → {dst}")
            runs = [agent.run(n, dst, holder=src, force=Option.TRANSFER) for _ in range(repeats + 1)][1:]
            if any(r.trace.decision != "transfer" for r in runs):
                raise RuntimeError(f"a forced transfer {src} → {dst} did not run as one: {runs[0].trace.note}")
            transfer = statistics.median(r.trace.ttft_s for r in runs)
            phases = [dict(r.trace.phases) for r in runs]
            measured = {Option.RECOMPUTE: recompute[(dst, n)], Option.TRANSFER: transfer}
            d = runs[0].decision
            scores = {o: d.scores[o] for o in measured}
            choice = min(scores, key=lambda o: (scores[o], list(Option).index(o)))
            rows.append(
                SweepPoint(
                    model,
                    f"{src.removeprefix('graphflow-')}>{dst.removeprefix('graphflow-')}",
                    n,
                    runs[0].trace.bytes_moved,
                    link.gbps,
                    measured[Option.RECOMPUTE],
                    transfer,
                    statistics.median(p.get("receive", 0.0) for p in phases),
                    statistics.median(p.get("rebuild", 0.0) for p in phases),
                    replace(d, option=choice).with_measured(measured[choice], measured),
                    src,
                    dst,
                    hosts.get(src, ""),
                    hosts.get(dst, ""),
                )
            )
    return rows
