"""The two-process transport benchmark (``graphflow bench transport``) on UCX and MPI: every row
carries ours, the raw reference and the bare ceiling, and the receiving side checks the bytes of
all three (a mismatch fails the job)."""

from __future__ import annotations

import pytest

from graphflow.bench.transport import bench_transport
from graphflow.bench.transport_pair import BenchPlan

BACKENDS = [pytest.param("ucx", marks=pytest.mark.ucx), pytest.param("mpi", marks=pytest.mark.mpi)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_pair_bench_rows_carry_ours_raw_and_bare(backend):
    plan = BenchPlan(sizes=[1 << 18, 5 << 18], block_bytes=1 << 18, iters=2, warmup=1, repeats=2)
    rows, _ = bench_transport([backend], plan)
    assert [(r.backend, r.nbytes, r.blocks) for r in rows] == [(backend, 1 << 18, 1), (backend, 5 << 18, 5)]
    for r in rows:
        assert r.bare_s is not None and r.ours_s > 0 and r.raw_s > 0 and r.bare_s > 0
        assert r.bare_ratio == pytest.approx(r.raw_s / r.bare_s)
        assert r.ours_over_bare == pytest.approx(r.bare_s / r.ours_s)
        flat = r.to_json()
        for kind in ("ours", "raw", "bare"):
            assert flat[f"{kind}_gbps"] == pytest.approx(r.nbytes / flat[f"{kind}_s"] / 1e9)
