from __future__ import annotations

import os
import random
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphflow.workflow.compile import ROOT, compile_workflow
from graphflow.workflow.corpus import Workflow, WorkflowNode, load_corpus, references
from graphflow.workflow.decode import Candidates, decode, is_valid
from graphflow.workflow.generator import GeneratorConfig, WorkflowGenerator
from graphflow.workflow.planner import DEFAULT_CHECKPOINT, CheckpointPlanner, Planner
from graphflow.workflow.train import TrainConfig, edge_f1, imitation, reinforce
from graphflow.workflow.wgraph import WGraph, structure

OPS = [
    ("Custom", "SOLVE"),
    ("Custom", "REVIEW"),
    ("ScEnsemble", "ENSEMBLE"),
    ("Test", "TEST"),
    ("Programmer", "PROGRAM"),
]


@st.composite
def random_workflows(draw):
    n = draw(st.integers(1, 6))
    nodes = tuple(WorkflowNode(f"n{i}", *OPS[draw(st.integers(0, len(OPS) - 1))]) for i in range(n))
    edges = tuple((f"n{i}", f"n{j}") for i in range(n) for j in range(i + 1, n) if draw(st.booleans()))
    return Workflow(f"w{n}", "prop", nodes, edges, (f"n{n - 1}",))


@settings(max_examples=40, deadline=None)
@given(st.lists(random_workflows(), min_size=1, max_size=4), st.integers(0, 10_000), st.floats(0.05, 0.95))
def test_every_decoded_workflow_is_a_valid_dag(workflows, seed, threshold):
    g = WGraph.build(workflows)
    cands = Candidates(g)
    scores = torch.rand(len(cands), generator=torch.Generator().manual_seed(seed))
    nodes, edges, _ = decode(cands, scores, threshold)
    wf = g.to_workflow(nodes, edges)
    assert is_valid(wf)
    legal = set(g.edges)
    assert all(e in legal for e in edges)
    sampled = decode(cands, scores, pick=lambda _i, p: random.Random(seed).random() < p)
    assert is_valid(g.to_workflow(sampled[0], sampled[1]))


def test_generator_shapes():
    g = WGraph.build(load_corpus())
    cands = Candidates(g)
    for cfg in (
        GeneratorConfig(in_dim=16, hidden=8),
        GeneratorConfig(in_dim=16, hidden=8, layers=1, task_node=False, task_in_mlp=False),
    ):
        model = WorkflowGenerator(cfg)
        out = model(torch.randn(len(g.ops), 16), torch.randn(16), cands.wgraph_index, cands.index)
        assert out.shape == (len(cands),) and bool(((out >= 0) & (out <= 1)).all())


def test_training_lowers_the_loss_and_learns_two_tasks():
    corpus = load_corpus()
    refs = references(corpus)
    planner = Planner(WGraph.build(corpus))
    examples = [
        ("Solve this grade-school word problem about apples.", refs["GSM8K"]),
        ("Write a Python function that reverses a list.", refs["HumanEval"]),
    ] * 4
    losses = imitation(planner, examples, TrainConfig(epochs=150, batch=8))
    assert losses[-1] < losses[0] / 4
    for text, ref in examples[:2]:
        assert structure(planner.generate(text)) == structure(ref)


def _mbpp_structure_reward() -> tuple[Planner, Callable[[Workflow, str], float]]:
    """A fresh planner and a cheap reward: edge F1 against MBPP's reference structure."""
    corpus = load_corpus()
    planner = Planner(WGraph.build(corpus))
    target = structure(references(corpus)["MBPP"])
    return planner, lambda wf, _task: edge_f1(structure(wf), target)


def test_reinforce_improves_a_cheap_reward():
    planner, reward = _mbpp_structure_reward()
    rewards = reinforce(planner, ["write code"], reward, steps=300, lr=3e-3)
    assert sum(rewards[-50:]) / 50 > sum(rewards[:50]) / 50 + 0.08


def test_compile_chains_reuse_state_and_fan_in_forks_root():
    refs = references(load_corpus())
    gs = compile_workflow(refs["GSM8K"])  # 3 solvers → ensemble → review, program
    parents = {n.id: n.state_parent for n in gs.nodes}
    assert parents == {"n1": ROOT, "n2": ROOT, "n3": ROOT, "n4": ROOT, "n5": "n4", "n6": "n4"}
    assert gs.ready(set()) == ["n1", "n2", "n3"]
    assert gs.ready({"n1", "n2", "n3"}) == ["n4"]
    assert set(gs.state_edges) == {(p, c) for c, p in parents.items()}
    assert gs.node("n5").template.startswith("\n### Step:")


def test_packaged_checkpoint_loads_and_is_small():
    assert DEFAULT_CHECKPOINT.stat().st_size < 5 << 20
    planner = Planner.load()
    wf = planner.generate("def add(a, b): return the sum of a and b")
    assert is_valid(wf)
    with pytest.raises(ValueError, match="empty"):
        planner.generate("")


def test_reinforce_with_several_samples_per_task_improves_and_checks_its_argument():
    planner, reward = _mbpp_structure_reward()
    rewards = reinforce(planner, ["write code"], reward, steps=75, lr=3e-3, samples=4, explore=0.05)
    assert len(rewards) == 300
    assert sum(rewards[-50:]) / 50 > sum(rewards[:50]) / 50 + 0.08
    with pytest.raises(ValueError, match="samples"):
        reinforce(planner, ["write code"], reward, samples=0)
    with pytest.raises(ValueError, match="explore"):
        reinforce(planner, ["write code"], reward, explore=0.5)


def test_soften_keeps_greedy_decisions_and_revives_saturated_gradients():
    planner = Planner.load()
    task_x = planner.encoder.encode(["What is 12 + 30?"])[0]
    before = planner.scores(task_x).detach()
    wf = planner.generate("What is 12 + 30?")
    planner.model.soften(4.0)
    after = planner.scores(task_x)
    assert torch.equal(before >= 0.5, after.detach() >= 0.5)
    assert planner.generate("What is 12 + 30?") == wf
    lowest = int(before.argmin())
    after[lowest].backward()
    grad = sum(p.grad.abs().sum() for p in planner.model.parameters() if p.grad is not None)
    assert float(grad) > 0.0
    assert after.detach()[lowest] > before[lowest] * 100
    with pytest.raises(ValueError, match="temperature"):
        planner.model.soften(0.0)


def test_reinforce_learns_a_task_conditioned_single_start():
    """The best workflow is one start operation, a different one per kind of task. Needs both
    the drawn, trained fallback start (with a fixed argmax the policy learns to decline every
    start) and the task skip (through the GCN alone the two kinds look almost alike)."""
    planner = Planner.load()
    planner.model.soften(4.0)
    kinds = {"add": "PROGRAM", "capital": "PATCH"}
    countries = ("France", "Japan", "Italy", "Spain", "Egypt", "Peru", "Chile", "Cuba", "Iran", "Kenya")
    tasks = [f"Calculate {a} plus {3 * a + 7}." for a in range(11, 21)] + [
        f"What is the capital of {c}?" for c in countries
    ]

    def kind(t: str) -> str:
        return "add" if "plus" in t else "capital"

    def reward(wf: Workflow, task: str) -> float:
        roles = [n.role for n in wf.nodes]
        return (0.8 if roles == [kinds[kind(task)]] else 0.3 if kinds[kind(task)] in roles else 0.1) - 0.02 * len(roles)

    torch.manual_seed(0)
    reinforce(planner, tasks, reward, steps=300, lr=1e-3, seed=0, samples=8, explore=0.1, task_skip=True)
    assert planner.model.config.task_skip
    picked = {t: [n.role for n in planner.generate(t).nodes] for t in tasks}
    right = {k: sum(picked[t] == [kinds[k]] for t in tasks if kind(t) == k) for k in kinds}
    assert min(right.values()) >= 7, (right, picked)


def test_reinforce_batches_tasks_and_scales_the_task_skips_learning_rate():
    planner = Planner.load()
    planner.model.soften(4.0)
    tasks = ["Calculate 12 plus 43.", "What is the capital of Peru?"]

    def reward(wf: Workflow, task: str) -> float:
        want = "PROGRAM" if "plus" in task else "PATCH"
        return float([n.role for n in wf.nodes] == [want]) - 0.02 * len(wf.nodes)

    planner.model.add_task_skip()
    before = {name: p.detach().clone() for name, p in planner.model.named_parameters()}
    torch.manual_seed(0)
    rewards = reinforce(
        planner,
        tasks,
        reward,
        steps=1,
        lr=1e-3,
        samples=8,
        explore=0.3,
        tasks_per_step=3,
        task_skip=True,
        skip_lr_scale=30.0,
    )
    assert len(rewards) == 1 * 3 * 8
    moved = {name: float((p.detach() - before[name]).abs().max()) for name, p in planner.model.named_parameters()}
    # Adam's first step moves each parameter by about lr·sign(grad): 30 × 1e-3 for the skip's projection
    assert 0.02 < moved["task_proj.weight"] <= 0.0301
    assert max(v for k, v in moved.items() if not k.startswith("task_proj")) <= 0.00101
    with pytest.raises(ValueError, match="tasks_per_step"):
        reinforce(planner, tasks, reward, tasks_per_step=0)
    with pytest.raises(ValueError, match="skip_lr_scale"):
        reinforce(planner, tasks, reward, skip_lr_scale=0.0)


def test_a_checkpoint_planner_loads_once_and_again_after_the_file_changes(tmp_path):
    path = tmp_path / "generator.pt"
    with pytest.raises(ValueError, match="no generator checkpoint at"):
        CheckpointPlanner(path).generate("Add 2 and 3.")
    trained = Planner.load()
    trained.save(path)
    planner = CheckpointPlanner(path)
    task = "Add 17 and 25, then multiply the sum by 3."
    assert planner.generate(task) == trained.generate(task) and planner.loads == 1
    assert planner.generate("What is 6 times 7?") == trained.generate("What is 6 times 7?") and planner.loads == 1
    other = Planner(trained.g, seed=5)  # NOTE: untrained: a different generator over the same wGraph
    other.save(path)
    later = path.stat().st_mtime_ns + 1_000_000_000  # NOTE: a retrain is minutes later; file times can be coarse
    os.utime(path, ns=(later, later))
    assert planner.generate(task) == other.generate(task) and planner.loads == 2
    with pytest.raises(ValueError, match="the task is empty"):
        planner.generate(" ")


def test_saving_over_a_checkpoint_leaves_only_the_new_one(tmp_path):
    path = tmp_path / "generator.pt"
    path.write_bytes(b"an older checkpoint")
    Planner.load().save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["generator.pt"]  # no part file left beside it
    assert Planner.load(path).generate("Add 2 and 3.") == Planner.load().generate("Add 2 and 3.")
