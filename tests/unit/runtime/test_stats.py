from __future__ import annotations

import json
from dataclasses import fields

from graphflow.runtime.stats import ReplicaStats, Route


def _stats(routes: tuple[Route, ...]) -> ReplicaStats:
    zero = {f.name: 0 for f in fields(ReplicaStats) if f.type in ("int", int)}
    text = {f.name: "" for f in fields(ReplicaStats) if f.type in ("str", str)}
    return ReplicaStats(**zero, **text, batching=True, routes=routes)


def test_a_route_is_shared_memory_only_when_every_lane_stays_in_memory():
    assert Route("p", ("sysv/memory", "cma/memory")).shared_memory
    assert not Route("p", ("tcp/gfc0",)).shared_memory
    assert not Route("p", ("sysv/memory", "tcp/eth0")).shared_memory
    assert not Route("p", ()).shared_memory  # a backend that could not say


def test_peers_are_named_by_replica_and_unknown_ones_keep_their_address():
    s = _stats((Route("a0f1", ("tcp/gfc0",)), Route("b2c3", ("cma/memory",))))
    named = s.with_peer_names({"a0f1": "graphflow-replica-1"})
    assert [r.peer for r in named.routes] == ["graphflow-replica-1", "b2c3"]
    assert named.routes[1].transports == ("cma/memory",)


def test_routes_flatten_to_json_and_read_back_the_same():
    flat = _stats((Route("graphflow-replica-2", ("sysv/memory", "cma/memory")),)).to_json()
    assert flat["routes"] == [
        {"peer": "graphflow-replica-2", "transports": ["sysv/memory", "cma/memory"], "shared_memory": True}
    ]
    assert json.loads(json.dumps(flat)) == flat
