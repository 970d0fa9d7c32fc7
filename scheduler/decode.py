"""What a node's decode adds on the replica it is placed on (the decode term of
:func:`scheduler.policy.place`).

A replica's engine loop runs every decoding request as one row of each step, and replicas
stepping at once share the host. A step's cost grows with its rows and with the KV it reads:
rows that continue one stored prefix read it once (the engine loop's shared-prefix attention),
rows over different prefixes read each of them (SmolLM2-135M on one core, 16 rows over 1K-token
prefixes: 152 ms a step over one shared prefix, 221 ms over 8, 302 ms over 16). So
:class:`~scheduler.cost.DecodeModel`'s ``T_step(rows, tokens)`` is read with ``tokens`` = the
KV tokens one step reads (its calibration runs rows over one shared prefix, where that is the
prefix's length), and each replica's :class:`Batch` says what its steps read now.

A node of ``s`` decode steps over ``L`` context tokens, of which the first ``p`` are a stored
prefix it continues, placed on replica ``r`` (``n_r`` rows reading ``R_r`` tokens; the node adds
``a = L − p`` when a row there already reads that prefix, else ``a = L``), where ``b`` of the
``N − 1`` other replicas are busy (``f = 1 + (κ − 1)·b / (N − 1)``, κ of the model), adds:

| part | seconds |
|---|---|
| its own steps | ``s · T_step(n_r + 1, R_r + a) · f`` |
| the batch already on ``r`` finishes later (``n_r > 0``) | ``s · (T_step(n_r + 1, R_r + a) − T_step(n_r, R_r)) · f`` |
| ``r`` was idle: every busy replica ``o`` steps slower | ``s · Σ_o T_step(n_o, R_o) · (κ − 1) / (N − 1)`` |
| a transfer from a busy source: its batch waits out the send | ``T_xfer(bytes)`` |

So a node joins a busy replica while one more row there costs less than a replica of its own
plus the contention that brings to the others, joins the replica where its siblings already read
its prefix rather than make a second replica read it too, and moves KV away from a busy replica
only when that still pays after the send has held up the source's own batch (the source's
process works the send on the cores its engine loop decodes on; at k = 2 agents over a 4K
root, moving the root for the second one made the makespan longer than keeping both on the
holder by about the send's time, ``experiments/multi_agent``). This is a model over measured
coefficients, not a measurement: every row is taken to decode as long as the node does, its
own tokens not growing, and prefill steps between decodes are left to the queue term.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from scheduler.cost import DecodeModel, LinkMatrix, t_transfer
from scheduler.policy import Decision, Option

__all__ = ["Batch", "decode_s", "send_delay_s", "shared_tokens"]


@dataclass(frozen=True)
class Batch:
    """What one replica's decode steps read now: ``rows`` rows, ``tokens`` KV tokens a step
    (each shared prefix once, each row's own part), and the keys of the stored prefixes they
    continue."""

    rows: int = 0
    tokens: int = 0
    prefixes: frozenset[Hashable] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.rows < 0 or self.tokens < 0:
            raise ValueError(f"a batch's rows and tokens must be non-negative, got {self.rows}, {self.tokens}")


def shared_tokens(d: Decision) -> int:
    """Leading context tokens ``d``'s node continues from stored blocks (its shared prefix in
    the engine loop): the own prefix it reuses, or the one it receives; none when it prefills
    (a recompute) or rebuilds a template (which runs outside the shared prefixes)."""
    if d.option is Option.REUSE:
        return d.local_tokens
    if d.option is Option.TRANSFER:
        return d.source_tokens
    return 0


def decode_s(
    model: DecodeModel,
    replica: str,
    batches: Mapping[str, Batch],
    steps: int,
    context: int,
    prefix: tuple[Hashable, int] | None = None,
) -> float:
    """Seconds a node's decode adds on ``replica`` (see the module docstring); ``batches`` gives
    what every replica of the deployment reads now, ``prefix`` the key and tokens of the stored
    prefix the node continues there (``None``: it reads its whole context on its own)."""
    if replica not in batches:
        raise ValueError(f"no batch for replica {replica!r} (have {sorted(batches)})")
    if steps < 0 or context < 0:
        raise ValueError(f"steps and context must be non-negative, got {steps}, {context}")
    if prefix is not None and not 0 <= prefix[1] <= context:
        raise ValueError(f"a prefix of {prefix[1]} tokens does not fit a {context}-token context")
    here = batches[replica]
    added = context - (prefix[1] if prefix is not None and prefix[0] in here.prefixes else 0)
    others = [b for o, b in batches.items() if o != replica]
    share = (model.contention - 1) / len(others) if others else 0.0
    factor = 1 + share * sum(1 for b in others if b.rows > 0)
    step = model.step_s(here.rows + 1, here.tokens + added)
    own = step * factor
    batch = max(0.0, step - model.step_s(here.rows, here.tokens)) * factor if here.rows else 0.0
    contended = 0.0 if here.rows else share * sum(model.step_s(b.rows, b.tokens) for b in others)
    return steps * (own + batch + contended)


def send_delay_s(d: Decision, rows: Mapping[str, int], kv_bytes_per_token: int, links: LinkMatrix) -> float:
    """What ``d``'s send holds up on its source: the send's time over the source's link to
    ``d``'s replica when ``d`` is a transfer from a replica with rows decoding, else 0."""
    if d.option is not Option.TRANSFER or not rows.get(d.source, 0):
        return 0.0
    return t_transfer((d.source_tokens - d.local_tokens) * kv_bytes_per_token, links.link(d.source, d.replica))
