"""``graphflow bench catalog``: its input checks, and a small run's figures."""

import pytest

from graphflow.bench.catalog import bench_catalog


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [({"blocks": 0}, "--blocks must be 1 or more, got 0"), ({"blocks_per_state": -2}, "--blocks-per-state")],
)
def test_a_count_under_one_is_refused_naming_its_option(kwargs, says):
    with pytest.raises(ValueError, match=says):
        bench_catalog(**kwargs)


def test_a_small_catalog_is_registered_looked_up_and_restored():
    got = bench_catalog(blocks=2048, blocks_per_state=256, lookups=200)
    assert got.blocks == 2048 and got.register_blocks_per_s > 0 and got.snapshot_s > 0 and got.restore_s > 0
    assert 0 < got.lookup_p50_us <= got.lookup_p99_us and got.bytes_per_block > 0
