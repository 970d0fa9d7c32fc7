from __future__ import annotations

import pytest

from graphflow.runtime.in_flight import InFlight, prefix_key
from scheduler.decode import Batch


def test_prefix_keys_match_on_equal_leading_tokens_only():
    a, b = [1, 2, 3, 4, 5], [1, 2, 3, 9, 9]
    assert prefix_key(a, 3) == prefix_key(b, 3)
    assert prefix_key(a, 3)[1] == 3
    assert prefix_key(a, 4) != prefix_key(b, 4)
    assert prefix_key(a, 0) is None


def test_a_shared_prefix_is_read_once_and_each_node_adds_its_own_tokens():
    nodes = InFlight()
    root = prefix_key(list(range(1000)), 992)
    nodes.add("run-1", "agent-0", "r0", root, 1050, 0.5)
    nodes.add("run-2", "agent-0", "r0", root, 1060, 0.25)  # another workflow over the same context
    nodes.add("run-3", "agent-0", "r1", None, 500, 2.0)  # a recompute: its whole context is its own
    got = nodes.batches(["r0", "r1", "r2"], {}, 700)
    assert got["r0"] == Batch(2, 992 + 58 + 68, frozenset({root[0]}))
    assert got["r1"] == Batch(1, 500, frozenset())
    assert got["r2"] == Batch()
    assert nodes.queue_s(["r0", "r1", "r2"], {}, 9.0) == pytest.approx({"r0": 0.75, "r1": 2.0, "r2": 0.0})


def test_requests_a_replica_reports_beyond_ours_are_charged_a_whole_context_each():
    nodes = InFlight()
    nodes.add("run-1", "agent-0", "r0", None, 100, 0.5)
    got = nodes.batches(["r0", "r1"], {"r0": 3, "r1": 0}, 700)
    assert got["r0"] == Batch(3, 100 + 2 * 700, frozenset())
    assert nodes.queue_s(["r0", "r1"], {"r0": 3, "r1": 0}, 9.0) == pytest.approx({"r0": 0.5 + 2 * 9.0, "r1": 0.0})
    # a node launched but not yet counted by its replica counts all the same
    assert nodes.batches(["r0"], {"r0": 0}, 700)["r0"].rows == 1


def test_finished_nodes_and_ended_runs_count_no_more():
    nodes = InFlight()
    nodes.add("run-1", "a", "r0", None, 100, 1.0)
    nodes.add("run-1", "b", "r0", None, 100, 1.0)
    nodes.add("run-2", "a", "r0", None, 100, 1.0)
    nodes.remove("run-1", "a")
    nodes.remove("run-1", "gone")  # removing twice (a retried node) is harmless
    assert nodes.batches(["r0"], {}, 1)["r0"].rows == 2
    nodes.end_run("run-1")
    assert nodes.batches(["r0"], {}, 1)["r0"] == Batch(1, 100, frozenset())
    assert nodes.queue_s(["r0"], {}, 9.0) == {"r0": 1.0}
