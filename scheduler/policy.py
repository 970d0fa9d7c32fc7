"""π(S) ∈ {REUSE, TRANSFER, RECONSTRUCT, RECOMPUTE} plus placement (AAFLOW+ eq. 44 with
GraphFlow's reconstruct option and a memory term).

For a node needing ``total`` context tokens on replica ``r``:

| option | predicted seconds | new KV bytes on r |
|---|---|---|
| REUSE (p tokens cached on r) | T_suffix(p, total) | (total − p)·bpt |
| TRANSFER (q tokens on s) | T_xfer((q − p)·bpt) + T_resume((q − p)·bpt) + T_suffix(q, total) | (total − p)·bpt |
| RECONSTRUCT ([o, o + k), h redone) | T_suffix(p', o) + T_rec(bytes) + T_suffix(o, o + h) | (total − p')·bpt |
|  | + T_suffix(o + k, total) | |
| RECOMPUTE | T_prefill(total) | total·bpt |

(p' = min(p, o): the local prefix in front of the rebuilt span.) Only the blocks past the
destination's own prefix travel, so a transfer is priced, and executed, as ``q − p`` tokens.

score = seconds + λ · new bytes (λ in seconds per byte; 0 by default). Every option that
applies is costed and kept in the frozen :class:`Decision`, which also carries what the
replica needs to carry the chosen option out (local tokens to reuse, the source and the token
range to receive, the residual to apply); the executor attaches the measured seconds
afterwards, and :func:`regret` / :func:`prediction_error` grade the record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from scheduler.cost import DecodeModel, LinearCost, LinkSpec, PrefillModel, t_prefill, t_prefill_suffix, t_transfer

__all__ = [
    "Decision",
    "Option",
    "Policy",
    "RemoteCopy",
    "ResidualCopy",
    "StateRequest",
    "decide",
    "place",
    "prefill_work_s",
    "prediction_error",
    "recompute",
    "regret",
]


class Option(StrEnum):
    REUSE = "reuse"
    TRANSFER = "transfer"
    RECONSTRUCT = "reconstruct"
    RECOMPUTE = "recompute"


@dataclass(frozen=True, slots=True)
class RemoteCopy:
    """``tokens`` leading context tokens held on ``replica`` (reached at transport ``address``)."""

    replica: str
    tokens: int
    link: LinkSpec
    address: str = ""


@dataclass(frozen=True, slots=True)
class ResidualCopy:
    """A base (+ residual) on the replica that rebuilds ``tokens`` context tokens starting at
    position ``start`` from ``nbytes`` of residual; ``recompute`` of them (the template's head,
    which the codec does not store) are recomputed. ``op`` and ``path`` name the template."""

    tokens: int
    nbytes: int
    recompute: int = 0
    start: int = 0
    op: str = ""
    path: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.recompute <= self.tokens:
            raise ValueError(f"recompute must lie in [0, tokens={self.tokens}], got {self.recompute}")
        if self.start < 0:
            raise ValueError(f"start must be non-negative, got {self.start}")


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
    decode: DecodeModel | None = None  # None: placement leaves decode out (it costs the same everywhere)


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
    total_tokens: int = 0
    local_tokens: int = 0  # leading tokens the replica reuses from its own store
    source_tokens: int = 0  # TRANSFER: the source holds [0, source_tokens); [local, source) travel
    source_address: str = ""  # TRANSFER: the source's transport address
    residual: ResidualCopy | None = None  # RECONSTRUCT: the base + residual to apply
    fallback: str = ""  # why a failure forced this recompute ("" for a policy decision)

    @property
    def chosen_predicted_s(self) -> float:
        return self.predicted_s[self.option]

    @property
    def receive(self) -> tuple[int, int]:
        """Token range whose blocks travel from the source (empty unless TRANSFER)."""
        if self.option is not Option.TRANSFER:
            return (0, 0)
        return (self.local_tokens, self.source_tokens)

    @property
    def prefill_tokens(self) -> int:
        """Context tokens the chosen option prefills (predicted; the replica reports actuals)."""
        if self.option is Option.REUSE:
            return self.total_tokens - self.local_tokens
        if self.option is Option.TRANSFER:
            return self.total_tokens - self.source_tokens
        if self.option is Option.RECONSTRUCT and self.residual is not None:
            return self.total_tokens - self.residual.tokens + self.residual.recompute
        return self.total_tokens

    def with_measured(self, seconds: float, all_options: dict[Option, float] | None = None) -> Decision:
        """A copy carrying what the chosen option actually took (and, in sweeps, every option)."""
        return replace(self, measured_s=seconds, measured_all_s=all_options)


def _reconstruct_s(req: StateRequest, pol: Policy, res: ResidualCopy) -> tuple[float, int]:
    """Seconds and local tokens of RECONSTRUCT (see the table in the module docstring)."""
    assert pol.reconstruct is not None
    total = req.total_tokens
    start = min(res.start, total)
    end = min(start + res.tokens, total)
    local = min(req.local_tokens, start)
    head = t_prefill_suffix(pol.prefill, start, min(start + res.recompute, end))
    seconds = (
        t_prefill_suffix(pol.prefill, local, start)
        + pol.reconstruct(res.nbytes)
        + head
        + t_prefill_suffix(pol.prefill, end, total)
    )
    return seconds, local


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
    best = _best_remote(req, pol)
    if best is not None:
        copy, seconds = best
        opts[Option.TRANSFER] = (seconds, (total - req.local_tokens) * bpt, copy.replica)
    res = req.residual
    if res is not None and pol.reconstruct is not None and res.tokens > 0 and res.start < total:
        seconds, local = _reconstruct_s(req, pol, res)
        opts[Option.RECONSTRUCT] = (seconds, (total - local) * bpt, req.replica)
    return opts


def _best_remote(req: StateRequest, pol: Policy) -> tuple[RemoteCopy, float] | None:
    """The remote copy whose missing blocks (past the local prefix) arrive and resume fastest."""
    best: tuple[RemoteCopy, float] | None = None
    for copy in req.remote:
        q = min(copy.tokens, req.total_tokens)
        if q <= req.local_tokens:
            continue
        nbytes = (q - req.local_tokens) * req.kv_bytes_per_token
        s = t_transfer(nbytes, copy.link) + pol.resume(nbytes) + t_prefill_suffix(pol.prefill, q, req.total_tokens)
        if best is None or s < best[1]:
            best = (copy, s)
    return best


def decide(req: StateRequest, pol: Policy, force: Option | None = None) -> Decision:
    """The option with the lowest ``seconds + λ·new bytes``; ties prefer REUSE, then
    TRANSFER, RECONSTRUCT, RECOMPUTE (cheapest in memory first). ``force`` takes that option
    where it is possible (ablations, sweeps measuring every option), else the best; the
    decision still predicts every option."""
    opts = _options(req, pol)
    scores = {o: s + pol.lam_s_per_byte * b for o, (s, b, _) in opts.items()}
    rank = list(Option)
    best = min(scores, key=lambda o: (scores[o], rank.index(o)))
    reason = req.reason if not req.compatible else f"{best.value}: lowest predicted cost"
    if force is not None and force in opts and force is not best:
        best, reason = force, f"{force.value}: forced (the policy's choice was {best.value})"
    local, source_tokens, address, residual = 0, 0, "", None
    if best is Option.REUSE:
        local = req.local_tokens
    elif best is Option.TRANSFER:
        copy, _ = _best_remote(req, pol) or (None, 0.0)
        assert copy is not None
        local, source_tokens, address = req.local_tokens, min(copy.tokens, req.total_tokens), copy.address
    elif best is Option.RECONSTRUCT:
        assert req.residual is not None
        residual = req.residual
        local = min(req.local_tokens, residual.start)
    return Decision(
        option=best,
        replica=req.replica,
        source=opts[best][2],
        predicted_s={o: v[0] for o, v in opts.items()},
        scores=scores,
        new_bytes={o: v[1] for o, v in opts.items()},
        reason=reason,
        total_tokens=req.total_tokens,
        local_tokens=local,
        source_tokens=source_tokens,
        source_address=address,
        residual=residual,
    )


def recompute(
    replica: str, total_tokens: int, kv_bytes_per_token: int, pol: Policy, why: str, fallback: str = ""
) -> Decision:
    """A RECOMPUTE decision made without weighing options (reuse off, or a failure's fallback)."""
    return Decision(
        Option.RECOMPUTE,
        replica,
        "",
        {Option.RECOMPUTE: t_prefill(pol.prefill, total_tokens)},
        {Option.RECOMPUTE: 0.0},
        {Option.RECOMPUTE: total_tokens * kv_bytes_per_token},
        why,
        total_tokens=total_tokens,
        fallback=fallback,
    )


def prefill_work_s(d: Decision, pol: Policy) -> float:
    """Predicted seconds of prefill ``d`` runs on its replica (its suffix on top of what the
    replica already holds or receives): the part of a node that occupies the replica's compute
    beyond the decode rows its engine loop batches."""
    return t_prefill_suffix(pol.prefill, d.total_tokens - d.prefill_tokens, d.total_tokens)


def place(
    requests: Sequence[StateRequest],
    queue_s: Mapping[str, float],
    pol: Policy,
    force: Option | None = None,
    extra_s: Callable[[Decision], float] | None = None,
) -> Decision:
    """Choose the replica: each replica's best option plus the work already queued there and,
    with ``extra_s``, what else the decision costs (the decode term, :mod:`scheduler.decode`;
    ``force``: see :func:`decide`)."""
    if not requests:
        raise ValueError("no candidate replicas to place the node on")
    decisions = [decide(r, pol, force) for r in requests]
    extra = extra_s or (lambda d: 0.0)
    return min(decisions, key=lambda d: d.scores[d.option] + queue_s.get(d.replica, 0.0) + extra(d))


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
