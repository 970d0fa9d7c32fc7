"""Workflow shapes the demo, the end-to-end check and the cluster tests run besides the
generated ones."""

from __future__ import annotations

from graphflow.workflow.corpus import Workflow, WorkflowNode

__all__ = ["fan_out_workflow"]


def fan_out_workflow(branches: int) -> Workflow:
    """``branches`` parallel solvers over the task, an ensemble over them, then a review: the
    shape whose branches the scheduler may spread over replicas (the task's KV then moves once)
    or batch on the replica that holds the task's KV, whichever it predicts faster."""
    roles = ["SOLVE", "SOLVE_ALT", "SOLVE_ASSUME", "SOLVE"]
    nodes = [WorkflowNode(f"b{i}", "Custom", roles[i % len(roles)]) for i in range(branches)]
    nodes += [WorkflowNode("join", "ScEnsemble", "ENSEMBLE"), WorkflowNode("check", "Custom", "REVIEW")]
    edges = tuple((f"b{i}", "join") for i in range(branches)) + (("join", "check"),)
    return Workflow("fan-out", "check", tuple(nodes), edges, ("check",))
