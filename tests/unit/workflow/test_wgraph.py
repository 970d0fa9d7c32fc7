from __future__ import annotations

import pytest

from graphflow.workflow.corpus import (
    Workflow,
    WorkflowNode,
    functional_role,
    load_corpus,
    load_yaml_workflows,
    references,
    workflows_yaml,
)
from graphflow.workflow.wgraph import TASK, WGraph, structure


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_corpus_loads_and_cuts_loop_back_edges(corpus):
    assert len(corpus) == 41
    mbpp2 = next(w for w in corpus if w.benchmark == "MBPP" and w.meta["round"] == 2)
    # the raw edges n3→n2 (back-edge) and n3→n3 (self-edge) are loop-carried: dropped
    assert ("n3", "n2") not in mbpp2.edges and ("n3", "n3") not in mbpp2.edges
    assert mbpp2.node("n3").loop_iters == 2


def test_references_follow_the_rule(corpus):
    refs = references(corpus)
    assert refs["GSM8K"].score == pytest.approx(0.96212)
    assert not any(w.failed for w in refs.values())


def test_merge_is_a_dag_containing_every_training_workflow(corpus):
    g = WGraph.build(corpus)
    assert (len(g.ops), len(g.edges)) == (19, 26)
    assert all(g.ops[s][2] < g.ops[d][2] for s, d in g.edges)
    assert all(g.contains(w) for w in corpus if not w.failed)


def test_structure_includes_task_edges():
    w = Workflow(
        "w", "b", (WorkflowNode("a", "Custom", "SOLVE"), WorkflowNode("b", "Custom", "REVIEW")), (("a", "b"),), ("b",)
    )
    s = structure(w)
    assert s == {(TASK, ("Custom", "SOLVE", 0)), (("Custom", "SOLVE", 0), ("Custom", "REVIEW", 1))}


def test_parquet_round_trip(corpus, tmp_path):
    g = WGraph.build(corpus)
    g.write_parquet(tmp_path / "g.parquet")
    assert WGraph.read_parquet(tmp_path / "g.parquet") == g


def test_bad_workflows_are_named_clearly(tmp_path):
    n = (WorkflowNode("a", "Custom", "SOLVE"), WorkflowNode("b", "Custom", "REVIEW"))
    with pytest.raises(ValueError, match="cyclic"):
        Workflow("loop", "b", n, (("a", "b"), ("b", "a")), ("b",))
    with pytest.raises(ValueError, match="unknown nodes"):
        Workflow("dangling", "b", n, (("a", "zz"),), ("b",))
    with pytest.raises(ValueError, match="no nodes"):
        Workflow("empty", "b", (), (), ())
    with pytest.raises(ValueError, match="unknown operation 'Teleport'"):
        functional_role("Teleport", None)
    (tmp_path / "w.yaml").write_text(
        "- nodes: [{id: a, operator: Custom, role: SOLVE}, {id: b, operator: Test}]\n  edges: [[a, b], [b, a]]\n"
    )
    with pytest.raises(ValueError, match="cyclic"):
        load_yaml_workflows(tmp_path / "w.yaml")


def test_user_yaml_workflow_extends_the_wgraph(corpus, tmp_path):
    (tmp_path / "w.yaml").write_text(
        "- name: plan-then-format\n  nodes: [{id: a, operator: Custom, role: SOLVE}, {id: b, operator: Format}]\n"
        "  edges: [[a, b]]\n  outputs: [b]\n"
    )
    user = load_yaml_workflows(tmp_path / "w.yaml")
    g = WGraph.build(corpus + user)
    assert ("Format", "FORMAT", 1) in g.ops and g.contains(user[0])


def test_workflows_written_as_yaml_load_back_equal(corpus, tmp_path):
    chosen = [w for w in corpus if len(w.nodes) > 2 and any(n.loop_iters > 1 for n in w.nodes)][:1] + corpus[:3]
    (tmp_path / "w.yaml").write_text(workflows_yaml(chosen))
    back = load_yaml_workflows(tmp_path / "w.yaml")
    assert back == chosen and [w.score for w in back] == [w.score for w in chosen]
    (tmp_path / "bad.yaml").write_text("- nodes: [{id: a\n")
    with pytest.raises(ValueError, match="bad.yaml is not valid YAML"):
        load_yaml_workflows(tmp_path / "bad.yaml")
