"""Deterministic prompt token ids of any length, for checks and benchmarks."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Encoder", "prompt_token_ids"]


class Encoder(Protocol):
    """Anything that turns text into token ids (a tokenizer, or a replica asked for it)."""

    def encode(self, text: str) -> list[int]: ...


_TEXT = (
    "An agent workflow splits a task into steps. The planner reads the question and lists what "
    "must be known; the solver works through each item and shows its reasoning; the reviewer "
    "checks every claim against the question and flags gaps; the writer turns the reviewed "
    "notes into one clear answer. "
)


def prompt_token_ids(tokenizer: Encoder, n: int) -> list[int]:
    """Exactly ``n`` token ids of numbered, readable agent-workflow text."""
    if n <= 0:
        raise ValueError(f"a prompt needs at least one token, got {n}")
    ids: list[int] = []
    section = 0
    while len(ids) < n:
        section += 1
        ids.extend(tokenizer.encode(f"Section {section}. {_TEXT}"))
    return ids[:n]
