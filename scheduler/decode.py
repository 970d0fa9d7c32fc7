"""What a node's decode adds on the replica it is placed on (the decode term of
:func:`scheduler.policy.place`).

A replica's engine loop runs every decoding request as one row of each step, and replicas
stepping at once share the host. A node of ``s`` decode steps over ``L`` context tokens placed
on replica ``r``, where ``n_r`` rows decode now and ``b`` of the ``N − 1`` other replicas are
busy (``f = 1 + (κ − 1)·b / (N − 1)``, with ``T_step`` and ``κ`` of
:class:`~scheduler.cost.DecodeModel`), adds:

| part | seconds |
|---|---|
| its own steps | ``s · T_step(n_r + 1, L) · f`` |
| the batch already on ``r`` finishes later (``n_r > 0``) | ``s · (T_step(n_r + 1, L) − T_step(n_r, L)) · f`` |
| ``r`` was idle: every busy replica ``o`` steps slower | ``s · Σ_o T_step(n_o, L) · (κ − 1) / (N − 1)`` |
| a transfer from a busy source: its batch waits out the send | ``T_xfer(bytes)`` |

So a node joins a busy replica while one more row there costs less than a replica of its own
plus the contention that brings to the others, and moves KV away from a busy replica only when
that still pays after the send has held up the source's own batch (the source's process works
the send on the cores its engine loop decodes on; at k = 2 agents over a 4K root, moving the
root for the second one made the makespan longer than keeping both on the holder by about the
send's time, ``experiments/multi_agent``). This is a model over measured coefficients, not
a measurement: every row is taken to have the node's context and to decode as long as it does,
and prefill steps between decodes are left to the queue term.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.cost import DecodeModel, LinkMatrix, t_transfer
from scheduler.policy import Decision, Option

__all__ = ["decode_s", "send_delay_s"]


def decode_s(model: DecodeModel, replica: str, rows: Mapping[str, int], steps: int, context: int) -> float:
    """Seconds a node's decode adds on ``replica`` (see the module docstring); ``rows`` gives
    the rows decoding on every replica of the deployment now."""
    if replica not in rows:
        raise ValueError(f"no row count for replica {replica!r} (have {sorted(rows)})")
    if steps < 0 or any(n < 0 for n in rows.values()):
        raise ValueError(f"steps and row counts must be non-negative, got {steps}, {dict(rows)}")
    others = {o: n for o, n in rows.items() if o != replica}
    share = (model.contention - 1) / len(others) if others else 0.0
    n = rows[replica]
    factor = 1 + share * sum(1 for m in others.values() if m > 0)
    own = model.step_s(n + 1, context) * factor
    batch = (model.step_s(n + 1, context) - model.step_s(n, context)) * factor if n else 0.0
    contended = 0.0 if n else share * sum(model.step_s(m, context) for m in others.values())
    return steps * (own + batch + contended)


def send_delay_s(d: Decision, rows: Mapping[str, int], kv_bytes_per_token: int, links: LinkMatrix) -> float:
    """What ``d``'s send holds up on its source: the send's time over the source's link to
    ``d``'s replica when ``d`` is a transfer from a replica with rows decoding, else 0."""
    if d.option is not Option.TRANSFER or not rows.get(d.source, 0):
        return 0.0
    return t_transfer((d.source_tokens - d.local_tokens) * kv_bytes_per_token, links.link(d.source, d.replica))
