"""What a replica reports about itself: :class:`ReplicaStats`.

A replica builds it (``ReplicaWorker.stats``); the cluster adds the manager's prefix-hit
counts (``with_hits``); ``graphflow status``, the benches and the checks read its fields, and
``to_json`` flattens it for ``--json`` (one object per replica, the nested parts' fields
beside the replica's own).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

from graphflow.kv.differential.modes import TemplateStats
from graphflow.kv.events import PrefixHits

__all__ = ["NodeInfo", "ReplicaStats", "Route"]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A Ray node of the deployment's cluster, and the replicas the manager knows on it."""

    node: str  # Ray's node id
    host: str  # its address
    alive: bool
    replicas: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Route:
    """How a replica's transport reaches one peer it has sent to: the peer (its transport
    address as the replica knows it; the cluster swaps in the replica's name) and the
    backend's transports in use (UCX: ``tcp/<device>`` across nodes, ``sysv/memory`` and
    ``cma/memory`` between replicas of one node)."""

    peer: str
    transports: tuple[str, ...]

    @property
    def shared_memory(self) -> bool:
        """Whether every lane stays in this host's memory (no network device)."""
        return bool(self.transports) and all(t.endswith("/memory") for t in self.transports)


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    replica: str
    model: str
    transport: str
    node: str
    host: str
    device: str
    eviction: str
    threads: int
    used_bytes: int
    capacity_bytes: int
    peak_bytes: int
    blocks: int
    states: int
    prefaulted_bytes: int  # host memory faulted in before the first transfer
    prefault_short: str  # why fewer bytes were faulted in than asked ("" when not short)
    pool_bytes: int  # of those, still kept for receives (the pool yields to computed KV)
    batching: bool  # whether node calls go through the engine loop
    batching_off: str  # why not ("" when on)
    max_batch_tokens: int
    engine_steps: int
    engine_rows: int
    peak_rows: int
    engine_pauses: int  # steps paused between layers for a short prefill that arrived meanwhile
    queue: int  # node calls in this replica now
    shared_prefix_copies: int
    protected_states: int  # kept states a ready node of a running workflow needs (not evictable)
    abandoned_runs: int  # runs whose client went away before ending them, ended by the replica
    released_unread: int  # states released because no result announcing them reached the manager
    evictions_waiting: int  # evictions the manager has not heard of yet (the next result or report carries them)
    cpu_s: float = 0.0  # CPU seconds of the replica's process since it started, all its threads
    engine_busy_s: float = 0.0  # wall seconds the engine loop has spent in forwards
    padded_rows: tuple[tuple[int, int], ...] = ()  # (rows, rows run) of steps the loop pads, as measured at start
    linear_kernel: str = "torch"  # what the model's linear layers run on (torch | onednn), as measured at start
    # how nodes read the stored prefixes they continue ("in place (avx512)", or how and why)
    prefix_reading: str = "in place"
    templates: TemplateStats = field(default_factory=TemplateStats)
    prefix: PrefixHits = field(default_factory=PrefixHits)
    routes: tuple[Route, ...] = ()  # the peers this replica has connected to, and how

    def with_peer_names(self, names: Mapping[str, str]) -> ReplicaStats:
        """Routes naming peers by replica (``names``: transport address → replica name);
        a peer not in ``names`` (gone, or a client's probe) keeps its address."""
        return replace(self, routes=tuple(Route(names.get(r.peer, r.peer), r.transports) for r in self.routes))

    @property
    def kv_mode(self) -> str:
        return self.templates.kv_mode

    def with_hits(self, prefix: PrefixHits) -> ReplicaStats:
        return replace(self, prefix=prefix)

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        templates, prefix = out.pop("templates"), out.pop("prefix")
        out["padded_rows"] = [list(pair) for pair in self.padded_rows]
        out["routes"] = [
            {"peer": r.peer, "transports": list(r.transports), "shared_memory": r.shared_memory} for r in self.routes
        ]
        return {**out, **templates, **prefix}
