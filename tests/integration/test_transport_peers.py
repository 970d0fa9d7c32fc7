"""Peer rows of ``graphflow bench transport``: NIXL (UCX backend, DRAM → DRAM) moves the
benchmark's blocks between two processes and the reader compares every byte with the sender's;
Mooncake does the same where Debian's libibverbs1 is installed and says why where it is not."""

from __future__ import annotations

import ctypes.util

import pytest

from graphflow.bench.peers import run_peer
from graphflow.bench.transport import bench_transport
from graphflow.bench.transport_pair import BenchPlan

PLAN = BenchPlan(sizes=[1 << 18, 3 << 18], block_bytes=1 << 18, iters=2, warmup=1, repeats=1)


@pytest.mark.ucx
def test_nixl_reads_the_blocks_and_the_ucx_rows_gain_ours_over_peer():
    rows, peers = bench_transport(["ucx"], PLAN, peers=["nixl"])
    assert [p.peer for p in peers] == ["nixl"] and not peers[0].unavailable
    assert [(r.nbytes, r.blocks, r.verified_after) for r in peers[0].rows] == [
        (1 << 18, 1, True),
        (3 << 18, 3, True),
    ]
    for row, peer in zip(rows, peers[0].rows, strict=True):
        assert row.peer_gbps == {"nixl": peer.peer_gbps} and peer.peer_gbps > 0
        assert row.ours_over_peer["nixl"] == pytest.approx(row.ours_gbps / peer.peer_gbps)


def test_mooncake_runs_where_libibverbs_loads_and_says_why_where_it_does_not():
    result = run_peer("mooncake", BenchPlan(sizes=[1 << 18], block_bytes=1 << 17, iters=2, warmup=1, repeats=1), 300)
    if ctypes.util.find_library("ibverbs") is None:
        assert "libibverbs1" in result.unavailable
    else:
        assert [(r.nbytes, r.blocks, r.verified_after) for r in result.rows] == [(1 << 18, 2, True)]
