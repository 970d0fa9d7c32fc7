"""Results of ``graphflow sweep transfer-vs-recompute``: one :class:`SweepPoint` per link ×
context, and the :class:`SweepSummary` the command prints.

A point holds what was measured and the policy's decision for it (with every option's
measured time filled in); whether the decision was right, its prediction error and its
regret are derived from those. ``csv_row`` gives the CSV's columns, in the order
``sweep.csv`` has always had.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.policy import Decision, Option, prediction_error, regret

__all__ = ["SweepPoint", "SweepSummary", "summarize"]

RIGHT_WITHIN = 1.05  # a decision is right when its option took at most 5% longer than the best


@dataclass(frozen=True, slots=True)
class SweepPoint:
    model: str
    link: str
    context: int
    nbytes: int
    link_gbps_fitted: float
    measured_recompute_s: float
    measured_transfer_s: float  # receive + rebuild (+ the template's prefill on a deployment)
    measured_recv_s: float
    measured_resume_s: float
    policy: Decision  # the policy's choice, with every option's measured time
    src: str = ""  # a deployment's pair: the replica holding the context
    dst: str = ""  # the replica running the node
    src_host: str = ""
    dst_host: str = ""

    @property
    def measured(self) -> dict[Option, float]:
        return {Option.RECOMPUTE: self.measured_recompute_s, Option.TRANSFER: self.measured_transfer_s}

    @property
    def oracle(self) -> Option:
        measured = self.measured
        return min(measured, key=lambda o: measured[o])

    @property
    def right(self) -> bool:
        measured = self.measured
        return measured[self.policy.option] <= RIGHT_WITHIN * measured[self.oracle]

    @property
    def rel_error(self) -> float:
        return prediction_error([self.policy])[0]

    def csv_row(self) -> dict[str, Any]:
        pair = (
            {"src": self.src, "dst": self.dst, "src_host": self.src_host, "dst_host": self.dst_host} if self.src else {}
        )
        return {
            "model": self.model,
            "link": self.link,
            **pair,
            "context": self.context,
            "nbytes": self.nbytes,
            "link_gbps_fitted": self.link_gbps_fitted,
            "measured_recompute_s": self.measured_recompute_s,
            "measured_transfer_s": self.measured_transfer_s,
            "measured_recv_s": self.measured_recv_s,
            "measured_resume_s": self.measured_resume_s,
            "predicted_recompute_s": self.policy.predicted_s[Option.RECOMPUTE],
            "predicted_transfer_s": self.policy.predicted_s[Option.TRANSFER],
            "decision": self.policy.option.value,
            "oracle": self.oracle.value,
            "right": self.right,
            "rel_error": self.rel_error,
            "regret": regret([self.policy]),
        }


@dataclass(frozen=True, slots=True)
class SweepSummary:
    points: int
    decision_accuracy: float
    median_rel_error: float
    regret: float  # extra measured time of the choices over the best, ÷ the best's total
    csv: str = ""
    png: str = ""
    pairs: tuple[str, ...] = ()  # a deployment sweep: the pairs it ran
    links_gbps: Mapping[str, float] = field(default_factory=dict)  # and each pair's fitted link

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "points": self.points,
            "decision_accuracy": self.decision_accuracy,
            "median_rel_error": self.median_rel_error,
            "regret": self.regret,
            "csv": self.csv,
            "png": self.png,
        }
        if self.pairs:
            out["pairs"], out["links_gbps"] = list(self.pairs), dict(self.links_gbps)
        return out


def summarize(points: Sequence[SweepPoint]) -> SweepSummary:
    """Decision accuracy, median prediction error and regret over ``points``."""
    if not points:
        raise ValueError("the sweep measured no points; pass at least one context")
    decisions = [p.policy for p in points]
    return SweepSummary(
        len(points),
        sum(p.right for p in points) / len(points),
        statistics.median(prediction_error(decisions)),
        regret(decisions),
    )
