"""Differential KV as served: ``--kv-mode differential --templates detailed`` against
``--kv-mode exact`` on the same held-apart test tasks, through ``connect()`` → executor →
replica actor → manager.

``python -m experiments.kv_memory.served [--train-tasks 12] [--test-tasks 8]
[--recompute-fraction 0.15] [--quick] [--json] [--allow-dirty]``

Each mode gets a fresh embedded deployment (one replica, SmolLM2-135M, detailed templates). The
train tasks' workflows (the planner's; the first of ``run.py``'s train tasks) run first: a
differential replica learns its hot paths' residuals online, from their first exact executions,
as it does when serving. Then the test tasks' workflows (the first of ``run.py``'s test tasks)
run, and each test node's output text, its decision (``reconstruct`` where its template was
rebuilt from base + residual) and its served time to first token (``NodeTrace.first_token_s``:
from the executor deciding the node to its first token) are kept. Reported: the rate of test
workflows whose final answer, and of test nodes whose output, is identical to the exact
deployment's, and the median per-node TTFT ratio (differential ÷ exact, same node), over the
rebuilt nodes and over all nodes. Writes ``results/served/kv_memory_served.json``, its
``meta.json`` and the README's served table.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

from experiments.common import progress, publish_served, served_args
from experiments.kv_memory.run import TRAIN_TASKS
from graphflow.workflow.planner import Planner
from graphflow.workflow.tasks import load_tasks

HERE = Path(__file__).parent
RECONSTRUCT = "reconstruct"


def run_mode(
    mode: str, train: list[tuple[str, Any]], test: list[tuple[str, Any]], args: Any, say: Any
) -> list[dict[str, Any]]:
    """Every workflow through a fresh deployment in ``mode``; one row per test workflow."""
    from graphflow.client import connect

    client = connect(
        model=args.model,
        replicas=1,
        decode_steps=args.decode,
        kv_mode=mode,
        templates="detailed",
        recompute_head=0,
        recompute_fraction=args.recompute_fraction,
        capacity_mib=args.capacity_mib,
    )
    for i, (task, wf) in enumerate(train):
        client.run(task, workflow=wf)
        say(f"{mode}: train {i + 1}/{len(train)}")
    out = []
    for i, (task, wf) in enumerate(test):
        result = client.run(task, workflow=wf)
        nodes = {
            t.node: {"output": t.output, "decision": t.decision, "first_token_s": t.first_token_s} for t in result.nodes
        }
        out.append({"final": result.final, "nodes": nodes, "wall_s": result.wall_s})
        say(f"{mode}: test {i + 1}/{len(test)}")
    out.append({"replica_templates": dataclasses.asdict(client.status()[0].templates)})
    return out


def compare(exact: list[dict[str, Any]], diff: list[dict[str, Any]]) -> dict[str, Any]:
    """Identity and TTFT of the differential deployment against the exact one, test node by node."""
    runs = list(zip(exact[:-1], diff[:-1], strict=True))
    same_final = [e["final"] == d["final"] for e, d in runs]
    node_rows = []
    for w, (e, d) in enumerate(runs):
        for node, dn in d["nodes"].items():
            en = e["nodes"][node]
            node_rows.append(
                {
                    "workflow": w,
                    "node": node,
                    "rebuilt": dn["decision"] == RECONSTRUCT,
                    "identical_output": dn["output"] == en["output"],
                    "ttft_ratio": dn["first_token_s"] / en["first_token_s"],
                }
            )
    rebuilt = [r for r in node_rows if r["rebuilt"]]

    def med(rows: list[dict[str, Any]]) -> float | None:
        return statistics.median(r["ttft_ratio"] for r in rows) if rows else None

    def rate(rows: list[dict[str, Any]]) -> float | None:
        return statistics.fmean(r["identical_output"] for r in rows) if rows else None

    return {
        "test_workflows": len(runs),
        "test_nodes": len(node_rows),
        "rebuilt_nodes": len(rebuilt),
        "identical_final_rate": statistics.fmean(same_final),
        "identical_output_rate": rate(node_rows),
        "identical_output_rate_rebuilt": rate(rebuilt),
        "ttft_ratio_rebuilt_median": med(rebuilt),
        "ttft_ratio_all_median": med(node_rows),
        "nodes": node_rows,
        "replica_templates": diff[-1]["replica_templates"],
    }


def table(s: dict[str, Any], settings: dict[str, Any]) -> str:
    def f(x: float | None, spec: str) -> str:
        return "—" if x is None else format(x, spec)

    return "\n".join(
        [
            "| test workflows | test nodes | rebuilt (reconstruct) | identical final answer | identical node output "
            "| … of rebuilt nodes | node TTFT ÷ exact, rebuilt (median) | … all nodes |",
            "|---|---|---|---|---|---|---|---|",
            f"| {s['test_workflows']} | {s['test_nodes']} | {s['rebuilt_nodes']} "
            f"| {f(s['identical_final_rate'], '.3f')} "
            f"| {f(s['identical_output_rate'], '.3f')} | {f(s['identical_output_rate_rebuilt'], '.3f')} "
            f"| {f(s['ttft_ratio_rebuilt_median'], '.2f')} | {f(s['ttft_ratio_all_median'], '.2f')} |",
            "",
            f"Model {settings['model']}, one replica per mode, detailed templates, {settings['train_tasks']} train "
            f"workflows served first (the differential replica learns from them), {settings['decode']} tokens per "
            f"node, at least {settings['recompute_fraction']:.0%} of each template recomputed.",
        ]
    )


def main() -> None:
    def configure(p: Any) -> None:
        p.add_argument("--model", default="smollm2-135m")
        p.add_argument("--train-tasks", type=int, default=12)
        p.add_argument("--test-tasks", type=int, default=8)
        p.add_argument("--decode", type=int, default=8)
        p.add_argument("--recompute-fraction", type=float, default=0.15)
        p.add_argument("--capacity-mib", type=int, default=4096)

    args = served_args(__doc__, configure)
    if args.quick:
        args.model, args.train_tasks, args.test_tasks, args.decode = "tiny-llama", 3, 2, 4
    say = progress(args.json)
    gsm = [t.text for t in load_tasks() if t.benchmark == "GSM8K"]
    planner = Planner.load()
    if args.train_tasks > TRAIN_TASKS:
        raise SystemExit(f"--train-tasks must be at most {TRAIN_TASKS}: the tasks after those are the test set")
    texts = gsm[: args.train_tasks] + gsm[TRAIN_TASKS : TRAIN_TASKS + args.test_tasks]
    pairs = [(t, planner.generate(t)) for t in texts]
    train, test = pairs[: args.train_tasks], pairs[args.train_tasks :]
    exact = run_mode("exact", train, test, args, say)
    diff = run_mode("differential", train, test, args, say)
    s = compare(exact, diff)
    keys = ("model", "train_tasks", "test_tasks", "decode", "recompute_fraction", "capacity_mib")
    settings = {k: getattr(args, k) for k in keys}
    publish_served(HERE, "kv_memory_served", {**settings, **s}, settings, table(s, settings), args.quick, args.json)


if __name__ == "__main__":
    main()
