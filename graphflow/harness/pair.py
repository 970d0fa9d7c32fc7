"""Entry point of one process of a two-process check or benchmark.

``python -m graphflow.harness.pair --job transfer|bench|sweep|probe|ttft|agents --backend ucx|mpi --role 0|1
--rendezvous DIR [job options]``. Under ``mpirun`` the role is the rank. Each process writes
``DIR/result{role}.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from graphflow.harness.rendezvous import exchange_addresses, write_result
from transport.base import TransportConfig
from transport.registry import create


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--job", choices=["transfer", "bench", "sweep", "probe", "ttft", "agents"], required=True)
    p.add_argument("--backend", choices=["ucx", "mpi"], required=True)
    p.add_argument("--role", type=int, default=-1)
    p.add_argument("--rendezvous", required=True)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--sizes", default="1048576")
    p.add_argument("--block-bytes", type=int, default=1 << 20)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--contexts", default="256,1024")
    p.add_argument("--suffix", type=int, default=64)
    p.add_argument("--root-tokens", type=int, default=256)
    p.add_argument("--workloads", default="1x2", help="agents job: ROOTSxAGENTS_PER_ROOT, comma separated")
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--systems", default="dense,text,local,local_holder,ours")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    folder = Path(args.rendezvous)
    transport = create(args.backend, TransportConfig(timeout_s=args.timeout))
    if args.backend == "mpi":
        args.role = int(transport.address)
        peer = str(1 - args.role)
    else:
        peer = exchange_addresses(folder, args.role, transport.address)
    result: Any
    try:
        if args.job == "transfer":
            from graphflow.checks.transfer import TransferCheck, side_json

            result = side_json(args.role, TransferCheck(model=args.model, tokens=args.tokens), transport, peer, folder)
        elif args.job == "probe":
            from transport.probe import probe_pair

            sizes = [int(x) for x in args.sizes.split(",")]
            result = probe_pair(transport, args.role, peer, sizes, args.block_bytes, args.repeats)  # type: ignore[arg-type]
        elif args.job == "sweep":
            from graphflow.bench.sweep import SweepPlan, sweep_side

            contexts = [int(c) for c in args.contexts.split(",")]
            result = sweep_side(transport, args.role, peer, SweepPlan(args.model, contexts, args.repeats))  # type: ignore[arg-type]
        elif args.job == "ttft":
            from graphflow.bench.ttft import TtftPlan, ttft_side

            contexts = [int(c) for c in args.contexts.split(",")]
            ttft_plan = TtftPlan(args.model, contexts, args.suffix, args.repeats, threads=args.threads)
            result = ttft_side(transport, args.role, peer, ttft_plan)  # type: ignore[arg-type]
        elif args.job == "agents":
            from graphflow.bench.agents import AgentsPlan, agents_side

            loads = [(int(r), int(a)) for r, a in (w.split("x") for w in args.workloads.split(","))]
            agents_plan = AgentsPlan(
                args.model,
                args.root_tokens,
                loads,
                args.suffix,
                args.decode,
                tuple(args.systems.split(",")),
                args.repeats,
                args.threads,
            )
            result = agents_side(transport, args.role, peer, agents_plan)  # type: ignore[arg-type]
        else:
            from graphflow.bench.transport_pair import BenchPlan, run_pair

            plan = BenchPlan(
                [int(s) for s in args.sizes.split(",")], args.block_bytes, args.iters, args.warmup, args.repeats
            )
            result = [row.to_json() for row in run_pair(transport, args.role, peer, plan)]
    finally:
        transport.close()
    write_result(folder, args.role, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
