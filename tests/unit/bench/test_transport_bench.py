import statistics

import numpy as np
import pytest

from graphflow.bench.transport import bench_transport
from graphflow.bench.transport_pair import BenchPlan, _bare_cut


def test_local_bench_times_every_transfer_and_reports_their_median():
    plan = BenchPlan(sizes=[1 << 16, 3 << 16], block_bytes=1 << 16, iters=2, warmup=1, repeats=3)
    rows, _ = bench_transport(["local"], plan)
    assert [(r.backend, r.nbytes, r.blocks) for r in rows] == [("local", 1 << 16, 1), ("local", 3 << 16, 3)]
    for r in rows:
        assert len(r.ours_ms) == len(r.raw_ms) == plan.repeats * plan.iters
        # the row's times are the median transfer's (the ms lists are rounded to 0.01 ms)
        assert abs(statistics.median(r.ours_ms) - r.ours_s * 1e3) <= 0.01
        assert abs(statistics.median(r.raw_ms) - r.raw_s * 1e3) <= 0.01
        assert r.bare_s is None and "bare_ratio" not in r.to_json()  # one process: no bare ceiling


def test_bare_cut_follows_the_wire_messages():
    sizes = [3 << 20, 3 << 20, 3 << 20, 1 << 20]  # NOTE: the wire puts runs of ≤ 8 MiB in one message
    buf = (np.arange(sum(sizes)) % 251).astype(np.uint8)
    msgs, blocks = _bare_cut(buf, sizes)
    assert [(seq, len(v)) for seq, v in msgs] == [(16, 6 << 20), (17, 4 << 20)]
    assert [[len(b) for b in m] for m in blocks] == [[3 << 20, 3 << 20], [3 << 20, 1 << 20]]
    assert bytes(blocks[1][1]) == buf[9 << 20 :].tobytes()


def test_a_plan_that_would_measure_nothing_is_refused():
    with pytest.raises(ValueError, match="no sizes"):
        BenchPlan(sizes=[])
    with pytest.raises(ValueError, match="at least 1"):
        BenchPlan(sizes=[1 << 16], iters=0)
    with pytest.raises(ValueError, match="at least 1"):
        BenchPlan(sizes=[1 << 16], repeats=0)


def test_an_unknown_backend_is_refused_before_any_backend_runs():
    said = []
    plan = BenchPlan(sizes=[1 << 16], block_bytes=1 << 16, iters=1, warmup=1, repeats=1)
    with pytest.raises(ValueError, match="unknown backend 'carrier'; use local, ucx, mpi, ray"):
        bench_transport(["local", "carrier"], plan, say=said.append)
    assert said == []  # NOTE: local would have been timed first
