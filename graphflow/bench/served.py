"""One agent node through the served path, with its context on one replica and the agent pinned
to another: the measurement that ``experiments/ttft --served`` and the deployment sweep
(``graphflow sweep transfer-vs-recompute --address``) share.

A run is a real workflow run (``WorkflowExecutor.run``: the manager, the policy, the replica
actors, the served transport): the task root (``L`` context tokens) is materialized on the
holder, the agent node (its template after the context) runs on the agent replica, and the
scheduler decides how its KV gets there unless the caller forces an option. Each call uses an
upstream context of its own (shifted by whole blocks), so no replica already holds it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from graphflow.client import Client, new_run_id
from graphflow.models.prompts import prompt_token_ids
from graphflow.runtime.trace import NodeTrace
from graphflow.workflow.compile import ROOT, ExecGraph, ExecNode
from scheduler.policy import Decision, Option

__all__ = ["AGENT_TEXT", "AgentRun", "PinnedAgent", "text_of_tokens"]

AGENT_TEXT = "\nNext agent: check the reasoning above and give the final answer as a number.\n" * 4


def text_of_tokens(encode: Callable[[str], list[int]], tokens: int, text: str = AGENT_TEXT) -> str:
    """The longest prefix of ``text`` (repeated as often as needed) that ``encode`` turns into
    at most ``tokens`` tokens: an agent prompt of a given length in any model's tokenizer (one
    model spends a token per character, another one per word)."""
    if tokens < 1:
        raise ValueError(f"the agent's prompt needs at least 1 token, got {tokens}")
    if not text:
        raise ValueError("the text to take the agent's prompt from is empty")
    while len(encode(text)) <= tokens:
        text += text  # NOTE: every extra token needs at least one character, so this ends
    lo, hi = 0, len(text)  # encode(text[:lo]) fits, encode(text[:hi]) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if len(encode(text[:mid])) <= tokens else (lo, mid)
    if lo == 0:
        raise ValueError(f"no prefix of the agent's text encodes to {tokens} tokens or fewer")
    return text[:lo]


@dataclass(frozen=True, slots=True)
class AgentRun:
    trace: NodeTrace  # the agent node's row (replica timings, phases, decision)
    decision: Decision  # what the policy predicted for every option
    first_token: int


class PinnedAgent:
    """Runs the agent node of one context length at a time on a deployment (see the module doc)."""

    def __init__(self, client: Client, template: str = AGENT_TEXT, prompt_tokens: int = 0) -> None:
        """``prompt_tokens`` (when > 0) cuts ``template`` to that many of the served model's
        tokens, so the agent's prompt has the same length whatever the tokenizer."""
        self.client = client
        self._shift = itertools.count(16, 16)  # NOTE: whole blocks: every call's chain of block keys is new
        self._encoded: dict[str, list[int]] = {}
        if prompt_tokens > 0:
            template = text_of_tokens(self.encode, prompt_tokens, template)
        self.graph = ExecGraph(
            (ExecNode("agent", "Custom", "REVIEW", template, (), ROOT),), (), ((ROOT, "agent"),), ("agent",)
        )

    def encode(self, text: str) -> list[int]:
        """The served model's tokenizer, asked through a replica once per text (no model is
        loaded here; every context repeats the same numbered sections)."""
        if text not in self._encoded:
            c = self.client.cluster
            self._encoded[text] = list(c.get(c.call(c.replicas[0], "encode", text)))
        return list(self._encoded[text])

    def context(self, n: int) -> list[int]:
        """``n`` upstream tokens no replica holds yet."""
        shift = next(self._shift)
        return prompt_token_ids(self, n + shift)[shift:]

    def run(
        self, n: int, agent: str, holder: str = "", force: Option | None = None, context: list[int] | None = None
    ) -> AgentRun:
        """The agent over a fresh ``n``-token context on ``agent`` (or over ``context``, to compare
        two runs on the same tokens); with ``holder`` the context is materialized there first
        (reuse on), without it every token is prefilled on ``agent``."""
        tokens = self.context(n) if context is None else context
        ex = self.client.executor
        if holder:
            got = ex.run(self.graph, tokens, new_run_id(), pin={ROOT: holder, "agent": agent}, force=force)
        else:
            got = ex.run(self.graph, tokens, new_run_id(), reuse=False, pin={"agent": agent})
        return AgentRun(got.nodes[0], got.decisions[0], got.outputs["agent"][0])

    def hosts(self) -> dict[str, str]:
        """Each replica's host, as the deployment reports it."""
        return {s.replica: s.host for s in self.client.status()}
