import pytest
import torch

from graphflow.bench.peers import _measure, _unavailable, peer_columns
from graphflow.bench.transport_pair import BenchPlan


def test_peer_columns_match_ours_ucx_rows_by_size_and_mark_a_peer_that_did_not_run():
    rows = [
        {"backend": "ucx", "nbytes": 1 << 20, "ours_gbps": 2.0},
        {"backend": "ucx", "nbytes": 1 << 24, "ours_gbps": 6.0},
        {"backend": "mpi", "nbytes": 1 << 20, "ours_gbps": 3.0},
    ]
    peers = [
        {"peer": "nixl", "rows": [{"nbytes": 1 << 24, "peer_gbps": 4.0}, {"nbytes": 1 << 20, "peer_gbps": 8.0}]},
        {"peer": "mooncake", "unavailable": "mooncake cannot load"},
    ]
    peer_columns(rows, peers)
    assert rows[0]["peer_gbps"] == {"nixl": 8.0, "mooncake": None}
    assert rows[0]["ours_over_peer"] == {"nixl": 0.25, "mooncake": None}
    assert rows[1]["ours_over_peer"]["nixl"] == 1.5
    assert "peer_gbps" not in rows[2]


def test_a_missing_library_says_what_to_install():
    assert "libibverbs1" in _unavailable("mooncake", OSError("libibverbs.so.1: cannot open shared object file"))
    assert "pip install -e '.[peers]'" in _unavailable("nixl", ImportError("No module named 'nixl_cu12'"))


class _Copies:
    """A side whose read copies the sender's blocks, or leaves the receive blocks as they are."""

    def __init__(self, sent, into, deliver):
        self.sent, self.into, self.deliver, self.reads = sent, into, deliver, 0

    def read(self, size):
        self.reads += 1
        if self.deliver:
            for a, b in zip(self.into, self.sent, strict=True):
                a.copy_(b)


@pytest.mark.parametrize("deliver", [True, False])
def test_a_row_is_reported_only_for_bytes_that_arrived(deliver):
    plan = BenchPlan([2048], block_bytes=1024, iters=2, warmup=1, repeats=3)
    sent = [torch.arange(1024, dtype=torch.int16).to(torch.uint8), torch.full((1024,), 7, dtype=torch.uint8)]
    into = [s.clone() for s in sent]  # NOTE: already equal; the check must clear them before its last read
    side = _Copies(sent, into, deliver)
    if not deliver:
        with pytest.raises(RuntimeError, match="differ"):
            _measure(side, plan, 2048, sent, into)
        return
    row = _measure(side, plan, 2048, sent, into)
    assert side.reads == plan.repeats * (plan.warmup + plan.iters) + 1
    assert row["nbytes"] == 2048 and row["blocks"] == 2 and row["checksums"] is False
    assert row["peer_gbps"] == pytest.approx(2048 / row["peer_s"] / 1e9)
