from __future__ import annotations

import itertools

import pytest

from graphflow.kv.differential.modes import KVMode, kv_mode
from graphflow.kv.differential.template_kv import TemplateKV
from graphflow.runtime.plan import NodePlan, TemplateRef
from graphflow.runtime.replica import ReplicaWorker
from graphflow.runtime.replica_config import ReplicaConfig
from scheduler.policy import Option

R = Option.RECONSTRUCT

TEMPLATE = "\n### Step: review\nCheck the answer above and correct it if needed.\n"


_names = itertools.count()
_open: list[ReplicaWorker] = []


@pytest.fixture(autouse=True, scope="module")
def _close_workers():
    yield
    for w in _open:
        w.transport.close()


def _worker(mode: str, **kw) -> ReplicaWorker:
    w = ReplicaWorker(ReplicaConfig(f"tmpl-{next(_names)}", "tiny-llama", transport="local", kv_mode=mode, **kw))
    _open.append(w)
    return w


def _run(
    w: ReplicaWorker,
    task: str,
    sid: str,
    reuse: bool = False,
    path: tuple[str, ...] = ("SOLVE",),
    template: str = TEMPLATE,
) -> NodePlan:
    """A node the scheduler sent to be reconstructed (the replica decides only whether it can)."""
    tmpl = w.encode(template)
    ids = w.encode(task) + tmpl
    return NodePlan(sid, tuple(ids), 4, R, keep=reuse, template=TemplateRef("REVIEW", path, len(tmpl)))


def test_differential_learns_a_hot_path_then_rebuilds_its_template_and_never_keeps_it():
    w = _worker("differential", residual_refs=1, hot_min_count=1, recompute_head=2)
    first = w.run_node(_run(w, "Ann has 3 apples and buys 4 more.", "a", reuse=True))
    assert first.rebuilt_tokens == 0 and first.admit is not None  # exact, learned from
    assert "gone" in first.note  # planned as a rebuild, but nothing was learned yet
    n = len(w.encode(TEMPLATE))
    (held,) = first.templates  # reported for the manager: what the policy may price
    assert (held.op, held.path, held.tokens, held.recompute) == ("REVIEW", ("SOLVE",), n, 2) and held.nbytes > 0
    second = w.run_node(_run(w, "Bob reads 12 pages a day for 5 days.", "b", reuse=True))
    assert second.rebuilt_tokens == n - 1 and not second.note
    assert second.prefill_tokens == len(second_ids := w.encode("Bob reads 12 pages a day for 5 days.")) + 1
    assert second_ids and second.admit is None  # an approximate state is not offered for reuse
    s = w.stats().templates
    assert s.kv_mode == "differential" and s.residuals == 1 and s.templates_rebuilt == 1
    assert s.differential_residual_bytes > 0 and s.differential_base_bytes > 0
    # a path that is not hot yet runs exactly
    assert w.run_node(_run(w, "Cal walks 2 km.", "c", path=("PLAN",))).rebuilt_tokens == 0
    # a plan that does not ask for a rebuild is run exactly, even where one is possible
    plain = _run(w, "Dan has 9 coins.", "d")
    assert w.run_node(NodePlan("d", plain.tokens, 4, Option.RECOMPUTE, template=plain.template)).rebuilt_tokens == 0


def test_recomputing_the_whole_template_gives_the_exact_output():
    exact = _worker("exact")
    full = _worker("differential", residual_refs=1, hot_min_count=1, recompute_head=1000)
    for w in (exact, full):
        w.run_node(_run(w, "Ann has 3 apples and buys 4 more.", "a"))
    a = exact.run_node(_run(exact, "Bob reads 12 pages a day for 5 days.", "b"))
    b = full.run_node(_run(full, "Bob reads 12 pages a day for 5 days.", "b"))
    assert b.rebuilt_tokens > 0 and a.rebuilt_tokens == 0
    assert a.output_ids == b.output_ids
    assert exact.stats().kv_mode == "exact"


def test_stateless_rebuilds_from_the_base_alone_and_modes_are_checked():
    w = _worker("stateless")
    res = w.run_node(_run(w, "Ann has 3 apples and buys 4 more.", "a"))
    assert res.rebuilt_tokens == len(w.encode(TEMPLATE)) - 1
    assert [h.path for h in res.templates] == [None]  # a base serves every path
    with pytest.raises(ValueError, match="unknown KV mode 'fuzzy'"):
        kv_mode("fuzzy")
    with pytest.raises(ValueError, match="unknown KV mode"):
        _worker("fuzzy")
    with pytest.raises(ValueError, match="must fit in the context"):
        run = _run(w, "x", "z")
        w.run_node(NodePlan("z", run.tokens, 2, R, template=TemplateRef("REVIEW", (), len(run.tokens) + 1)))
    with pytest.raises(ValueError, match="exact mode"):
        TemplateKV(w.engine, KVMode.EXACT)


def test_a_changed_template_gets_a_new_base_and_drops_old_residuals():
    w = _worker("differential", residual_refs=1, hot_min_count=1)
    w.run_node(_run(w, "Ann has 3 apples.", "a"))
    assert w.stats().templates.residuals == 1
    res = w.run_node(_run(w, "Bob reads.", "b", template="\n### Step: review\nNow be brief.\n"))
    assert res.rebuilt_tokens == 0  # the old residual was for another template version
    assert w.stats().templates.residuals == 1  # relearned for the new one


def test_the_executor_passes_templates_and_traces_what_was_rebuilt():
    from graphflow.runtime.executor import WorkflowExecutor
    from graphflow.runtime.local import LocalCluster
    from graphflow.workflow.compile import compile_workflow
    from graphflow.workflow.corpus import load_corpus, references
    from scheduler.cost import LinearCost, LinkSpec, PrefillModel
    from scheduler.policy import Policy

    c = LocalCluster("tiny-llama", replicas=1, kv_mode="stateless")
    try:
        w = c.workers["replica-0"]
        # a rebuild priced far below a prefill: the policy reconstructs wherever a base is reported
        pol = Policy(PrefillModel(0.05, 1e-3, 0.0), reconstruct=LinearCost(1e-4, 0.0))
        ex = WorkflowExecutor(c, pol, LinkSpec("local", 1e9, 1e-5), w.kv_bytes_per_token(), w.model_key(), 3)
        gs = compile_workflow(references(load_corpus())["GSM8K"])
        task = w.encode("A train travels 60 km per hour for 3 hours. How far does it go?")
        first = ex.run(gs, task, "s1")
        assert len(first.nodes) == len(gs.nodes)
        assert {t.decision for t in first.nodes} <= {"reuse", "recompute"}  # no base reported yet: nothing to price
        second = ex.run(gs, task, "s2")
        rebuilt = [t for t in second.nodes if t.decision == "reconstruct"]
        assert rebuilt and all(t.rebuilt_tokens > 0 for t in rebuilt)
        assert w.stats().templates.templates_rebuilt == len(rebuilt)
        assert all(d.residual is not None for d in second.decisions if d.option.value == "reconstruct")
        c.manager("check_integrity")
    finally:
        c.close()
