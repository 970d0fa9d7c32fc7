"""Prompt templates and executor contracts of the atomic operations (written for GraphFlow).

A node's prompt is laid out so KV can be shared (see ``compile.py``):

```
[task context] [outputs of predecessors, in order] [operation template]
```

``{task}`` is never inside a template: the task context is the shared root every node forks.

Two sets: ``short`` (one instruction per operation; fast tests) and ``detailed``
(``templates_detailed``: instructions, output format and two worked examples, 250–800 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphflow.workflow.templates_detailed import DETAILED_TEMPLATES

__all__ = ["CONTRACTS", "TEMPLATES", "TEMPLATE_SETS", "Contract", "template_for", "template_set"]


def _step(title: str, instruction: str) -> str:
    return f"\n### Step: {title}\n{instruction}\n"


TEMPLATES: dict[str, str] = {
    "SOLVE": _step(
        "solve",
        "Work through the problem above one step at a time, then state the final answer on its own line.",
    ),
    "SOLVE_ALT": _step(
        "solve another way",
        "Solve the problem above with a different method than the obvious one; end with the final answer.",
    ),
    "SOLVE_ASSUME": _step(
        "check assumptions",
        "List what the problem above takes for granted, check each one, then give the final answer.",
    ),
    "REVIEW": _step(
        "review",
        "Read the work above as a strict checker. Point out any error, then write the corrected final answer.",
    ),
    "REFINE": _step(
        "refine",
        "Use the feedback above to fix the solution. Return only the improved solution.",
    ),
    "ENSEMBLE": _step(
        "pick the consensus",
        "Several candidate solutions are above. Choose the answer most of them agree on and restate it.",
    ),
    "PROGRAM": _step(
        "program",
        "Write a Python function solve() that computes the answer to the problem above; return its code.",
    ),
    "CODE": _step(
        "write code",
        "Write the Python function the problem above asks for. Return only the code.",
    ),
    "TEST": _step(
        "test",
        "Run the code above against the examples in the problem. Report failures and a repaired version.",
    ),
    "ANSWER": _step(
        "answer",
        "Think briefly, then give the final answer only.",
    ),
    "FORMAT": _step(
        "format",
        "Rewrite the final answer above in the exact short form the question expects.",
    ),
    "PATCH": _step(
        "patch",
        "Write a unified diff that fixes the issue described above.",
    ),
}


@dataclass(frozen=True, slots=True)
class Contract:
    """What an operation consumes and produces."""

    inputs: str  # "task" | "task+predecessors" | "candidates"
    output: str  # "text" | "code" | "verdict"
    executes_code: bool = False


CONTRACTS: dict[str, Contract] = {
    "SOLVE": Contract("task", "text"),
    "SOLVE_ALT": Contract("task", "text"),
    "SOLVE_ASSUME": Contract("task", "text"),
    "REVIEW": Contract("task+predecessors", "text"),
    "REFINE": Contract("task+predecessors", "text"),
    "ENSEMBLE": Contract("candidates", "text"),
    "PROGRAM": Contract("task+predecessors", "code", executes_code=True),
    "CODE": Contract("task", "code"),
    "TEST": Contract("task+predecessors", "verdict", executes_code=True),
    "ANSWER": Contract("task", "text"),
    "FORMAT": Contract("task+predecessors", "text"),
    "PATCH": Contract("task", "code"),
}


TEMPLATE_SETS: dict[str, dict[str, str]] = {"short": TEMPLATES, "detailed": DETAILED_TEMPLATES}


def template_set(name: str) -> dict[str, str]:
    """The templates called ``name`` (short or detailed), or a ``ValueError`` naming the sets."""
    try:
        return TEMPLATE_SETS[name]
    except KeyError:
        raise ValueError(f"unknown template set {name!r}; use one of {', '.join(TEMPLATE_SETS)}") from None


def template_for(role: str, templates: str = "short") -> str:
    chosen = template_set(templates)
    try:
        return chosen[role]
    except KeyError:
        raise ValueError(f"no template for operation role {role!r}; known: {sorted(chosen)}") from None
