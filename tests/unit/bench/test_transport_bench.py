import statistics

from graphflow.bench.transport import bench_transport
from graphflow.bench.transport_pair import BenchPlan


def test_local_bench_times_every_transfer_and_reports_their_median():
    plan = BenchPlan(sizes=[1 << 16, 3 << 16], block_bytes=1 << 16, iters=2, warmup=1, repeats=3)
    rows = bench_transport(["local"], plan)
    assert [(r["backend"], r["nbytes"], r["blocks"]) for r in rows] == [("local", 1 << 16, 1), ("local", 3 << 16, 3)]
    for r in rows:
        assert len(r["ours_ms"]) == len(r["raw_ms"]) == plan.repeats * plan.iters
        # the row's times are the median transfer's (the ms lists are rounded to 0.01 ms)
        assert abs(statistics.median(r["ours_ms"]) - r["ours_s"] * 1e3) <= 0.01
        assert abs(statistics.median(r["raw_ms"]) - r["raw_s"] * 1e3) <= 0.01
