"""Where a transferred context comes from (a module of its own: its cluster has three replicas,
named as test_executor's two are)."""

from __future__ import annotations

from graphflow.runtime.local import LocalCluster
from graphflow.workflow.compile import compile_workflow
from graphflow.workflow.shapes import fan_out_workflow
from scheduler.cost import LinkMatrix, LinkSpec
from tests.unit.runtime.test_executor import TASK, _executor


def test_a_replica_still_receiving_a_context_is_never_the_source_of_another_transfer(monkeypatch):
    """Replica-1 is receiving the context for b1 when b2 is decided for replica-2: b2's copy
    must come from replica-0, which holds it (replica-1 holds none of it yet, even where its
    link to replica-2 is the fastest: a send from it would leave b2 waiting out the deadline)."""
    trio = LocalCluster("tiny-llama", replicas=3, timeout_s=20.0)  # a regression waits this out, then fails
    try:
        w0 = trio.workers["replica-0"]
        ids = w0.encode("(source) " + TASK * 2)
        ex = _executor(trio, link_bw=1e12, prefill_b=1e-2)  # prefill dear, links fast: every branch moves
        ex.links = LinkMatrix({("replica-1", "replica-2"): LinkSpec("local", 1e13, 1e-6)}, ex.links.default)
        sources: list[str] = []
        call = trio.call

        def recording(replica, method, *args):
            if method == "send_blocks":
                sources.append(replica)
            return call(replica, method, *args)

        monkeypatch.setattr(trio, "call", recording)
        pin = {"ROOT": "replica-0", "b0": "replica-0", "b1": "replica-1", "b2": "replica-2"}
        got = ex.run(compile_workflow(fan_out_workflow(3)), ids, "t-source", pin=pin)
        monkeypatch.setattr(trio, "call", call)
        rows = {t.node: t for t in got.nodes}
        assert rows["b1"].decision == rows["b2"].decision == "transfer", got.nodes
        assert rows["b2"].source == "replica-0" and not rows["b2"].note, rows["b2"]
        assert set(sources) == {"replica-0"}, sources
    finally:
        trio.close()
