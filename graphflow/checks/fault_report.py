"""What ``graphflow check faults`` reports: one :class:`ScenarioResult` per scenario, and the
:class:`FaultReport` over them (the scenarios themselves: :mod:`graphflow.checks.faults`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["NODE_SCENARIOS", "SCENARIOS", "FaultReport", "ScenarioResult"]

SCENARIOS = (
    "replica-dies",
    "transfer-fails",
    "corrupt-bytes",
    "manager-restart",
    "memory-pressure",
    "load",
    "bad-input",
)
NODE_SCENARIOS = ("node-dies",)  # with --nodes


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    name: str
    completed: bool
    outputs_correct: bool
    detail: str
    lost_requests: int = 0
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.completed and self.outputs_correct


@dataclass(frozen=True, slots=True)
class FaultReport:
    rows: tuple[ScenarioResult, ...]

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.rows)

    @property
    def lost_requests(self) -> int:
        return sum(r.lost_requests for r in self.rows)

    @property
    def ok(self) -> bool:
        return self.passed == len(self.rows) and not self.lost_requests

    def to_json(self) -> dict[str, Any]:
        rows = [asdict(r) for r in self.rows]
        return {"rows": rows, "scenarios": len(rows), "passed": self.passed, "lost_requests": self.lost_requests}
