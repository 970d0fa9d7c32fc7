"""π(S) ∈ {REUSE, TRANSFER, RECONSTRUCT, RECOMPUTE} plus placement (AAFLOW+ eq. 44 with
GraphFlow's reconstruct option and a memory term).

For a node needing ``total`` context tokens on replica ``r``:

| option | predicted seconds | new KV bytes on r |
|---|---|---|
| REUSE (p tokens cached on r) | T_suffix(p, total) | (total − p)·bpt |
| TRANSFER (q tokens on s) | T_transfer(q·bpt) + T_resume(q·bpt) + T_suffix(q, total) | total·bpt |
| RECONSTRUCT (Δ: k tokens, h redone) | T_reconstruct(bytes) + T_suffix(k − h, k) + T_suffix(k, total) | total·bpt |
| RECOMPUTE | T_prefill(total) | total·bpt |

score = seconds + λ · new bytes (λ in seconds per byte; 0 by default). Every option that
applies is costed and kept in the frozen :class:`Decision`; the executor attaches the
measured seconds afterwards, and :func:`regret` / :func:`prediction_error` grade the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from scheduler.cost import LinearCost, LinkSpec, PrefillModel, t_prefill, t_prefill_suffix, t_transfer

__all__ = [
    "Decision",
    "Option",
    "Policy",
    "RemoteCopy",
    "ResidualCopy",
    "StateRequest",
    "decide",
    "place",
    "prediction_error",
    "regret",
]


class Option(StrEnum):
    REUSE = "reuse"
    TRANSFER = "transfer"
    RECONSTRUCT = "reconstruct"
    RECOMPUTE = "recompute"


@dataclass(frozen=True, slots=True)
class RemoteCopy:
    replica: str
    tokens: int
    link: LinkSpec


@dataclass(frozen=True, slots=True)
class ResidualCopy:
    """A base + residual that rebuilds ``tokens`` of the context from ``nbytes`` of residual;
    ``recompute`` of them (the template's head, which the codec does not store) are recomputed."""

    tokens: int
    nbytes: int
    recompute: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.recompute <= self.tokens:
            raise ValueError(f"recompute must lie in [0, tokens={self.tokens}], got {self.recompute}")


@dataclass(frozen=True, slots=True)
class StateRequest:
    """What one node needs on one replica, and where its KV already is."""

    replica: str
    total_tokens: int
    kv_bytes_per_token: int
    local_tokens: int = 0
    remote: tuple[RemoteCopy, ...] = ()
    residual: ResidualCopy | None = None
    compatible: bool = True  # False: the cached state failed compat(); only RECOMPUTE applies
    reason: str = ""

    def __post_init__(self) -> None:
        if self.total_tokens <= 0 or self.kv_bytes_per_token <= 0:
            raise ValueError(f"need positive total_tokens and kv_bytes_per_token, got {self}")
        if not 0 <= self.local_tokens <= self.total_tokens:
            raise ValueError(f"local_tokens {self.local_tokens} outside [0, {self.total_tokens}]")


@dataclass(frozen=True, slots=True)
class Policy:
    """Calibrated costs the decision uses."""

    prefill: PrefillModel
    resume: LinearCost = field(default_factory=lambda: LinearCost(0.0, 0.0))
    reconstruct: LinearCost | None = None
    lam_s_per_byte: float = 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    option: Option
    replica: str
    source: str
    predicted_s: dict[Option, float]
    scores: dict[Option, float]
    new_bytes: dict[Option, int]
    reason: str
    measured_s: float | None = None
    measured_all_s: dict[Option, float] | None = None

    @property
    def chosen_predicted_s(self) -> float:
        return self.predicted_s[self.option]

    def with_measured(self, seconds: float, all_options: dict[Option, float] | None = None) -> Decision:
        """A copy carrying what the chosen option actually took (and, in sweeps, every option)."""
        return replace(self, measured_s=seconds, measured_all_s=all_options)


def _options(req: StateRequest, pol: Policy) -> dict[Option, tuple[float, int, str]]:
    bpt, total = req.kv_bytes_per_token, req.total_tokens
    opts: dict[Option, tuple[float, int, str]] = {Option.RECOMPUTE: (t_prefill(pol.prefill, total), total * bpt, "")}
    if not req.compatible:
        return opts
    if req.local_tokens > 0:
        opts[Option.REUSE] = (
            t_prefill_suffix(pol.prefill, req.local_tokens, total),
            (total - req.local_tokens) * bpt,
            req.replica,
        )
    best_remote = None
    for copy in req.remote:
        q = min(copy.tokens, total)
        if q <= req.local_tokens:
            continue
        nbytes = (q - req.local_tokens) * bpt
        s = t_transfer(nbytes, copy.link) + pol.resume(nbytes) + t_prefill_suffix(pol.prefill, q, total)
        if best_remote is None or s < best_remote[0]:
            best_remote = (s, total * bpt, copy.replica)
    if best_remote is not None:
        opts[Option.TRANSFER] = best_remote
    if req.residual is not None and pol.reconstruct is not None and req.residual.tokens > 0:
        k = min(req.residual.tokens, total)
        h = min(req.residual.recompute, k)
        # the h recomputed tokens attend over the k rebuilt ones: costed like a k − h → k suffix
        head = t_prefill_suffix(pol.prefill, k - h, k) if h else 0.0
        opts[Option.RECONSTRUCT] = (
            pol.reconstruct(req.residual.nbytes) + head + t_prefill_suffix(pol.prefill, k, total),
            total * bpt,
            req.replica,
        )
    return opts


def decide(req: StateRequest, pol: Policy) -> Decision:
    """The option with the lowest ``seconds + λ·new bytes``; ties prefer REUSE, then
    TRANSFER, RECONSTRUCT, RECOMPUTE (cheapest in memory first)."""
    opts = _options(req, pol)
    scores = {o: s + pol.lam_s_per_byte * b for o, (s, b, _) in opts.items()}
    rank = list(Option)
    best = min(scores, key=lambda o: (scores[o], rank.index(o)))
    reason = req.reason if not req.compatible else f"{best.value}: lowest predicted cost"
    return Decision(
        option=best,
        replica=req.replica,
        source=opts[best][2],
        predicted_s={o: v[0] for o, v in opts.items()},
        scores=scores,
        new_bytes={o: v[1] for o, v in opts.items()},
        reason=reason,
    )


def place(requests: Sequence[StateRequest], queue_s: dict[str, float], pol: Policy) -> Decision:
    """Choose the replica: each replica's best option plus the work already queued there."""
    if not requests:
        raise ValueError("no candidate replicas to place the node on")
    decisions = [decide(r, pol) for r in requests]
    return min(decisions, key=lambda d: d.scores[d.option] + queue_s.get(d.replica, 0.0))


def regret(decisions: Sequence[Decision]) -> float:
    """Extra measured time of the chosen options over the measured best, ÷ the best's total."""
    chosen = oracle = 0.0
    for d in decisions:
        if d.measured_all_s is None:
            raise ValueError("regret needs every option's measured time (a sweep record)")
        chosen += d.measured_all_s[d.option]
        oracle += min(d.measured_all_s.values())
    return (chosen - oracle) / oracle if oracle > 0 else 0.0


def prediction_error(decisions: Sequence[Decision]) -> list[float]:
    """|predicted − measured| ÷ measured of each decision's chosen option."""
    out = []
    for d in decisions:
        if d.measured_s is None:
            raise ValueError("prediction_error needs measured_s on every decision")
        out.append(abs(d.chosen_predicted_s - d.measured_s) / d.measured_s)
    return out
