"""The reward study's tasks and their scoring (``experiments.generator_eval.reward``).

Two families whose answers can be checked mechanically, seeded: ``arithmetic`` (3-digit
addition and subtraction, 2-digit multiplication, in several phrasings) and ``capital``
(capital city of a country; the train and test splits use disjoint countries). :func:`score`
reads the final output node's text: ``arithmetic`` — the value after the last ``Result:``,
else the last number in the text, equals the answer; ``capital`` — the capital's name occurs
as a word.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

__all__ = ["CAPITALS", "Task", "make_tasks", "score"]

# (country, capital); even positions train, odd positions test — disjoint countries.
CAPITALS = (
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Italy", "Rome"),
    ("Germany", "Berlin"),
    ("Spain", "Madrid"),
    ("Egypt", "Cairo"),
    ("Russia", "Moscow"),
    ("China", "Beijing"),
    ("Greece", "Athens"),
    ("Portugal", "Lisbon"),
    ("Austria", "Vienna"),
    ("Norway", "Oslo"),
    ("Sweden", "Stockholm"),
    ("Finland", "Helsinki"),
    ("Denmark", "Copenhagen"),
    ("Poland", "Warsaw"),
    ("Ireland", "Dublin"),
    ("Hungary", "Budapest"),
    ("Thailand", "Bangkok"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Argentina", "Buenos Aires"),
    ("Cuba", "Havana"),
    ("Turkey", "Ankara"),
    ("Iran", "Tehran"),
    ("Iraq", "Baghdad"),
    ("Mexico", "Mexico City"),
    ("Canada", "Ottawa"),
    ("Australia", "Canberra"),
    ("India", "New Delhi"),
    ("Belgium", "Brussels"),
    ("Netherlands", "Amsterdam"),
    ("Czech Republic", "Prague"),
    ("Chile", "Santiago"),
    ("Colombia", "Bogota"),
    ("Venezuela", "Caracas"),
    ("Philippines", "Manila"),
    ("Indonesia", "Jakarta"),
    ("Vietnam", "Hanoi"),
    ("South Korea", "Seoul"),
    ("Ukraine", "Kyiv"),
    ("Romania", "Bucharest"),
    ("Bulgaria", "Sofia"),
    ("Serbia", "Belgrade"),
    ("Morocco", "Rabat"),
    ("Ethiopia", "Addis Ababa"),
    ("Nigeria", "Abuja"),
    ("Ghana", "Accra"),
    ("Pakistan", "Islamabad"),
    ("Afghanistan", "Kabul"),
)
_ARITH_PHRASES = ("What is {a} {op} {b}?", "Compute {a} {op} {b}.", "Calculate {a} {op} {b}.")
_CAPITAL_PHRASES = ("What is the capital of {c}?", "Name the capital city of {c}.", "Which city is the capital of {c}?")


@dataclass(frozen=True, slots=True)
class Task:
    family: str
    text: str
    answer: str


def make_tasks(split: str, per_family: int, seed: int) -> list[Task]:
    """``per_family`` arithmetic and capital tasks of ``split`` ("train" or "test")."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(f"{split}:{seed}")
    countries = CAPITALS[0::2] if split == "train" else CAPITALS[1::2]
    if per_family > len(countries) * len(_CAPITAL_PHRASES):
        raise ValueError(f"at most {len(countries) * len(_CAPITAL_PHRASES)} capital tasks per split")
    tasks = []
    for i in range(per_family):
        op = ("+", "-", "*")[i % 3]
        a, b = (
            (rng.randint(12, 99), rng.randint(12, 99)) if op == "*" else (rng.randint(100, 999), rng.randint(100, 999))
        )
        value = a + b if op == "+" else a - b if op == "-" else a * b
        tasks.append(Task("arithmetic", rng.choice(_ARITH_PHRASES).format(a=a, op=op, b=b), str(value)))
    pairs = [(c, p) for c in countries for p in _CAPITAL_PHRASES]
    for country, phrase in rng.sample(pairs, per_family):
        tasks.append(Task("capital", phrase.format(c=country[0]), country[1]))
    return tasks


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _as_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def score(task: Task, text: str) -> float:
    """1.0 when the final text answers the task (rules in the module doc), else 0.0."""
    if task.family == "arithmetic":
        at = text.rfind("Result:")
        got = _as_number(text[at + len("Result:") :].split("\n", 1)[0] if at >= 0 else text)
        return float(got is not None and got == float(task.answer))
    if task.family == "capital":
        return float(re.search(rf"\b{re.escape(task.answer)}\b", text, re.I) is not None)
    raise ValueError(f"unknown task family {task.family!r}")
