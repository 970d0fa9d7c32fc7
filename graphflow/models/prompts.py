"""Deterministic prompt token ids of any length, for checks and benchmarks."""

from __future__ import annotations

from graphflow.models.tokenizer import Tokenizer

__all__ = ["prompt_token_ids"]

_TEXT = (
    "An agent workflow splits a task into steps. The planner reads the question and lists what "
    "must be known; the solver works through each item and shows its reasoning; the reviewer "
    "checks every claim against the question and flags gaps; the writer turns the reviewed "
    "notes into one clear answer. "
)


def prompt_token_ids(tokenizer: Tokenizer, n: int) -> list[int]:
    """Exactly ``n`` token ids of numbered, readable agent-workflow text."""
    if n <= 0:
        raise ValueError(f"a prompt needs at least one token, got {n}")
    ids: list[int] = []
    section = 0
    while len(ids) < n:
        section += 1
        ids.extend(tokenizer.encode(f"Section {section}. {_TEXT}"))
    return ids[:n]
