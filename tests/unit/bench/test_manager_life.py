from __future__ import annotations

import pytest

from graphflow.bench.manager_life import bench_manager_life


def test_ended_runs_keep_the_manager_to_its_retention_window_and_unended_ones_do_not():
    rows = bench_manager_life((40, 200), nodes_per_run=4, blocks_per_node=3, states_per_replica=5, retain_ended_s=12.0)
    ended = [r for r in rows if r.runs_ended]
    kept = [r for r in rows if not r.runs_ended]
    assert [r.nodes for r in ended] == [r.nodes for r in kept] == [40, 200]
    for a, b in zip(ended, kept, strict=True):
        assert a.live_blocks == b.live_blocks == 2 * 5 * 3  # two replicas, five states each
        assert b.states_kept == b.nodes and b.catalog_rows == 3 * b.nodes  # never ended: all ever admitted
        # ended: runs that ended under 12 s (nodes) ago, as of the last end_run: 12 nodes, 3 runs, of
        # which the last 10 are live; the catalog keeps the live rows and the 2 evicted states' rows
        assert a.states_kept == 12 and a.catalog_rows == 30 + 2 * 3 and a.snapshot_s > 0


def test_checkpoints_must_increase():
    with pytest.raises(ValueError, match="increasing positive node counts"):
        bench_manager_life((100, 50))
    with pytest.raises(ValueError, match="must be positive"):
        bench_manager_life((10,), nodes_per_run=0)
