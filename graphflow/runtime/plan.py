"""What the executor asks a replica to do for one node, and what the replica reports back.

A :class:`NodePlan` is built from the scheduler's :class:`~scheduler.policy.Decision` alone:
it names the local prefix to reuse, the token range to receive and from where, the template
to rebuild from base (+ residual), and which of the workflow's states are needed again soon
(eviction keeps them). The replica carries it out and re-derives none of it; where the world
changed since the decision (blocks evicted, a residual relearned) it does the exact thing
instead and says so in :attr:`NodeResult.note`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphflow.kv.events import AdmitEvent, EvictEvent, TemplateEvent, TemplateHolding
from graphflow.kv.state_index import run_of
from scheduler.policy import Option

__all__ = ["MaterializeResult", "NodePlan", "NodeResult", "TemplateRef"]


@dataclass(frozen=True, slots=True)
class TemplateRef:
    """The operation template that ends a node's context: its role, the roles whose outputs
    precede it (the differential-KV path key) and its length in tokens."""

    op: str
    path: tuple[str, ...]
    tokens: int

    def __post_init__(self) -> None:
        if self.tokens < 0:
            raise ValueError(f"a template has a non-negative length, got {self.tokens}")


@dataclass(frozen=True, slots=True)
class NodePlan:
    """One node on one replica.

    ``option`` is the scheduler's choice; ``local_tokens`` leading tokens come from the
    replica's own store; for TRANSFER the blocks of ``receive`` = [lo, hi) arrive from the peer
    at ``source_address`` under ``transfer_id``; for RECONSTRUCT the template is rebuilt from
    the base (+ residual) the replica holds. ``keep`` stores the result for reuse (False when
    reuse is off). ``next_use`` gives, for states of the running workflow, the steps until a
    node needs them (0: a node that is ready now), which eviction honours. ``await_tokens``:
    the context's first ``await_tokens`` tokens are arriving at this replica in another node's
    transfer; the node waits for them to land before it looks up its prefix
    (:mod:`graphflow.runtime.arrivals`). ``owner`` names the client running the workflow
    (``Cluster.owner``): once it is gone, the replica stops honouring its ``next_use``."""

    state_id: str
    tokens: tuple[int, ...]
    decode_steps: int
    option: Option = Option.RECOMPUTE
    keep: bool = True
    local_tokens: int = 0
    receive: tuple[int, int] = (0, 0)
    source_address: str = ""
    transfer_id: int = 0
    parents: tuple[str, ...] = ()
    template: TemplateRef | None = None
    next_use: tuple[tuple[str, int], ...] = ()
    await_tokens: int = 0
    owner: str = ""

    def __post_init__(self) -> None:
        lo, hi = self.receive
        if not 0 <= lo <= hi <= len(self.tokens):
            raise ValueError(f"receive range {self.receive} must lie within the {len(self.tokens)} context tokens")
        if hi > lo and not self.source_address:
            raise ValueError("a plan that receives blocks needs the source's transport address")
        if not 0 <= self.local_tokens <= len(self.tokens):
            raise ValueError(f"local_tokens {self.local_tokens} outside [0, {len(self.tokens)}]")
        if not 0 <= self.await_tokens <= len(self.tokens) or (self.await_tokens and hi > lo):
            raise ValueError(
                f"await_tokens {self.await_tokens} must lie within the context, and a plan that receives "
                "blocks itself cannot also wait for another node's"
            )

    @property
    def run_id(self) -> str:
        """The workflow run this node belongs to (state ids are ``run:node``)."""
        return run_of(self.state_id)


@dataclass(frozen=True, slots=True)
class NodeResult:
    state_id: str
    replica: str
    output_ids: tuple[int, ...]
    text: str
    reused_tokens: int  # from the replica's own store
    transferred_tokens: int  # received from the source and used
    prefill_tokens: int
    bytes_moved: int
    ttft_s: float
    total_s: float
    admit: AdmitEvent | None = field(default=None, compare=False)  # None: not kept (reuse off, no room)
    evicted: tuple[EvictEvent, ...] = field(default=(), compare=False)  # states dropped to make room
    # its own prefix + the blocks it received, kept as a state of their own (``…:transfer``; None: none, no room)
    kept_prefix: AdmitEvent | None = field(default=None, compare=False)
    rebuilt_tokens: int = 0  # template tokens not prefilled in order (base + residual; counts a recomputed head)
    templates: tuple[TemplateHolding, ...] = field(default=(), compare=False)  # what the replica can rebuild now
    templates_stamp: int = field(default=0, compare=False)  # when, among its changes (graphflow.kv.copy_order)
    note: str = ""  # where the replica could not do what the plan said, what it did instead
    phases: tuple[tuple[str, float], ...] = field(default=(), compare=False)  # (phase, seconds), in order

    def manager_events(self) -> list[AdmitEvent | EvictEvent | TemplateEvent]:
        """What this result tells the manager, in the order the replica made the changes (each
        is stamped, so the manager also orders them among other results: ``graphflow.kv.copy_order``)."""
        admits = [a for a in (self.kept_prefix, self.admit) if a is not None]
        templates = [TemplateEvent(self.replica, self.templates, self.templates_stamp)] if self.templates else []
        return [*self.evicted, *admits, *templates]


@dataclass(frozen=True, slots=True)
class MaterializeResult:
    """The task root prefilled once on a replica."""

    replica: str
    tokens: int
    seconds: float
    kept: bool  # False: larger than the replica's whole store (nodes will prefill it)
    events: tuple[AdmitEvent | EvictEvent, ...] = field(default=(), compare=False)
    reused: int = 0  # leading tokens the replica already held (a context computed upstream), not prefilled
