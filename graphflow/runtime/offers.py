"""What a node can start from on each replica: the policy's input, from one manager lookup.

:func:`state_requests` turns the manager's answer for a node's context (which replica holds
how long a prefix of it, and which can rebuild its template) into one
:class:`~scheduler.policy.StateRequest` per candidate replica: its own prefix (or the tokens a
transfer in flight is bringing it), the longer copies on other replicas it could receive, and
the template it could rebuild. A pure function of its arguments: the executor supplies the
links and transport addresses.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from graphflow.kv.events import NodeLookup, TemplateHolding
from graphflow.runtime.plan import TemplateRef
from scheduler.cost import LinkSpec
from scheduler.policy import RemoteCopy, ResidualCopy, StateRequest

__all__ = ["arriving_tokens", "residual_copy", "state_requests"]


def state_requests(
    look: NodeLookup,
    context: int,
    tmpl: TemplateRef,
    replicas: Sequence[str],
    live: Collection[str],
    block_tokens: int,
    kv_bytes_per_token: int,
    link: Callable[[str, str], LinkSpec],
    address: Callable[[str], str],
    transfers: bool = True,
    arriving: Mapping[str, int] | None = None,
) -> list[StateRequest]:
    """One request per replica of ``replicas`` (the candidates) for a node of ``context``
    tokens; copies are offered from ``live`` replicas only.

    Prefixes count in whole blocks and leave the last context token to prefill (its logits
    start the decode). Without ``transfers`` no other replica's copy is offered. ``arriving``:
    leading tokens a transfer in flight is bringing to a replica; they count as local there,
    never as a source for another replica (that replica holds none of them yet, and a send
    from it would leave its receiver waiting out the deadline). ``link(source, dest)`` and
    ``address(replica)`` describe the copies offered."""
    bt = block_tokens
    usable = (context - 1) // bt * bt
    have = {m.replica: min(m.num_tokens, usable) // bt * bt for m in look.matches}
    landing = {r: min(n, usable) // bt * bt for r, n in (arriving or {}).items()}
    held: dict[str, TemplateHolding] = dict(look.templates)
    requests = []
    for r in replicas:
        local = max(have.get(r, 0), landing.get(r, 0))
        remote = tuple(
            RemoteCopy(o, n, link(o, r), address(o))
            for o, n in have.items()
            if transfers and o != r and n > local and o in live
        )
        requests.append(
            StateRequest(
                r,
                context,
                kv_bytes_per_token,
                local_tokens=local,
                remote=remote,
                residual=residual_copy(held.get(r), context, tmpl),
            )
        )
    return requests


def arriving_tokens(ctx: Sequence[int], transferring: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Per replica, the leading tokens of ``ctx`` that a transfer in flight is bringing it."""
    return {r: len(p) for r, p in transferring.items() if 0 < len(p) < len(ctx) and tuple(ctx[: len(p)]) == p}


def residual_copy(h: TemplateHolding | None, total: int, tmpl: TemplateRef) -> ResidualCopy | None:
    """What ``h`` rebuilds of this context: the template but its last token (prefilled)."""
    if h is None or h.tokens != tmpl.tokens or tmpl.tokens < 2 or tmpl.tokens >= total:
        return None
    n = tmpl.tokens - 1
    return ResidualCopy(n, h.nbytes, min(h.recompute, n), total - tmpl.tokens, tmpl.op, tmpl.path)
