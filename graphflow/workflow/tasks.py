"""Benchmark tasks from ``<benchmark>_<split>.jsonl`` files (the formats of shared/data/tasks)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BENCHMARKS", "TEXT_FIELDS", "TaskExample", "default_tasks_dir", "load_tasks", "require_task", "task_text"]

BENCHMARKS = {
    "gsm8k": "GSM8K",
    "math": "MATH",
    "humaneval": "HumanEval",
    "mbpp": "MBPP",
    "hotpotqa": "HotpotQA",
    "drop": "DROP",
}
TEXT_FIELDS = ("question", "problem", "prompt", "context")


def require_task(task: str) -> None:
    """Refuse a task with no text (``ValueError``, one sentence)."""
    if not task or not task.strip():
        raise ValueError("the task is empty; pass the task's text")


@dataclass(frozen=True, slots=True)
class TaskExample:
    benchmark: str
    split: str
    index: int
    text: str
    raw: dict[str, Any] = field(compare=False, hash=False, repr=False)


def default_tasks_dir() -> Path:
    root = Path(os.environ.get("GRAPHFLOW_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
    return root / "tasks"


def task_text(raw: dict[str, Any]) -> str | None:
    """The task's text: the first of question / problem / prompt / context that is a string."""
    for f in TEXT_FIELDS:
        v = raw.get(f)
        if isinstance(v, str) and v.strip():
            return v.strip()
    return None


def load_tasks(folder: str | Path | None = None, max_per_file: int | None = None) -> list[TaskExample]:
    """Every task with a text in ``folder``; files without task texts (public tests) are skipped."""
    folder = Path(folder) if folder else default_tasks_dir()
    if not folder.is_dir():
        raise ValueError(f"task folder {folder} not found; pass --tasks DIR or set GRAPHFLOW_DATA")
    out: list[TaskExample] = []
    for path in sorted(folder.glob("*_*.jsonl")):
        prefix, split = path.stem.split("_", 1)
        bench = BENCHMARKS.get(prefix.lower())
        if bench is None:
            continue
        n = 0
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            raw = json.loads(line)
            text = task_text(raw)
            if text is None:
                continue
            out.append(TaskExample(bench, split, n, text, raw))
            n += 1
            if max_per_file and n >= max_per_file:
                break
    if not out:
        raise ValueError(f"no tasks with a question/problem/prompt/context field in {folder}")
    return out
