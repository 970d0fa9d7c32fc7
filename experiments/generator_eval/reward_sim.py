"""REINFORCE settings checked on a synthetic reward: ``python -m experiments.generator_eval.reward_sim [--json]``.

No model runs. The reward of a workflow for a task is drawn once per (task, workflow) from a
per-family success rate of its single start operation (multi-operation workflows: 0 for
arithmetic, 0.1 for capitals), minus the same node cost as the measured study. The rates are
``RATES``: per-family success of single-operation workflows on the *training* tasks of
``reward --seed 1`` (its REINFORCE samples), rounded. It answers one question quickly: with given
settings, does REINFORCE learn a different start per family (``PROGRAM`` for arithmetic, a prose
start for capitals) for several seeds? It scores nothing as measured success; the study itself
(:mod:`experiments.generator_eval.reward`) does that.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter
from typing import Any

import numpy as np
import xxhash

from experiments.generator_eval.reward import Settings, signature, train_generator
from experiments.generator_eval.reward_tasks import make_tasks
from graphflow.workflow.corpus import Workflow
from graphflow.workflow.planner import Planner

RATES = {
    "arithmetic": {"PROGRAM": 0.65},
    "capital": {"SOLVE": 0.4, "PATCH": 0.45, "SOLVE_ALT": 0.39, "SOLVE_ASSUME": 0.15, "CODE": 0.19, "PROGRAM": 0.05},
}
RIGHT = {"arithmetic": {"PROGRAM"}, "capital": {"SOLVE", "PATCH", "SOLVE_ALT"}}


def synthetic_success(family: str, task: str, wf: Workflow) -> float:
    """1.0 with the family's rate for the workflow's single operation, fixed per (task, workflow)."""
    roles = [n.role for n in wf.nodes]
    rate = RATES[family].get(roles[0], 0.0) if len(roles) == 1 else 0.1 * (family == "capital")
    draw = xxhash.xxh64_intdigest(f"{task}|{signature(wf)}".encode()) / 2**64
    return float(draw < rate)


def run(settings: Settings) -> dict[str, Any]:
    """Train as the study does, on the synthetic reward; the greedy start per test family."""
    train = make_tasks("train", settings.train_per_family, settings.seed)
    test = make_tasks("test", settings.test_per_family, settings.seed)
    family = {t.text: t.family for t in train}
    planner = Planner.load()

    def reward(wf: Workflow, task: str) -> float:
        return synthetic_success(family[task], task, wf) - settings.node_cost * len(wf.nodes)

    rewards = train_generator(planner, [t.text for t in train], reward, settings)
    picked = {
        f: Counter("+".join(n.role for n in planner.generate(t.text).nodes) for t in test if t.family == f)
        for f in RIGHT
    }
    share = {f: sum(c for role, c in picked[f].items() if role in RIGHT[f]) / sum(picked[f].values()) for f in RIGHT}
    return {
        "seed": settings.seed,
        "picked": {f: dict(c) for f, c in picked.items()},
        "right_share": share,
        "both_right": min(share.values()) >= 0.75,
        "reward_first": float(np.mean(rewards[:400])),
        "reward_last": float(np.mean(rewards[-400:])),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2,3,4,5", help="comma-separated seeds")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--tasks-per-step", type=int, default=None)
    p.add_argument("--skip-lr-scale", type=float, default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    base = Settings()
    for field, value in (
        ("steps", args.steps),
        ("tasks_per_step", args.tasks_per_step),
        ("skip_lr_scale", args.skip_lr_scale),
    ):
        if value is not None:
            base = dataclasses.replace(base, **{field: value})
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        row = run(dataclasses.replace(base, seed=seed))
        rows.append(row)
        print(f"seed {seed}: {row['picked']} both right: {row['both_right']}", flush=True)
    summary = {
        "settings": dataclasses.asdict(base),
        "seeds": rows,
        "both_right": sum(r["both_right"] for r in rows),
        "of": len(rows),
    }
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
