import pytest
import torch

from graphflow.bench.peers import _measure, _unavailable
from graphflow.bench.transport_pair import BenchPlan
from graphflow.bench.transport_rows import PeerResult, PeerRow, TransportRow, with_peers


def test_peer_columns_match_ours_ucx_rows_by_size_and_mark_a_peer_that_did_not_run():
    mib, sixteen = 1 << 20, 1 << 24

    def ours(backend, nbytes, gbps):  # a row whose ours moves at ``gbps``
        return TransportRow(backend, nbytes, nbytes >> 20, 1 << 20, nbytes / gbps / 1e9, 1.0)

    rows = [ours("ucx", mib, 2.0), ours("ucx", sixteen, 6.0), ours("mpi", mib, 3.0)]
    peers = [
        PeerResult("nixl", (PeerRow(sixteen, 16, sixteen / 4e9), PeerRow(mib, 1, mib / 8e9))),
        PeerResult("mooncake", unavailable="mooncake cannot load"),
    ]
    got = with_peers(rows, peers)
    assert got[0].peer_gbps == pytest.approx({"nixl": 8.0, "mooncake": None})
    assert got[0].ours_over_peer == pytest.approx({"nixl": 0.25, "mooncake": None})
    assert got[1].ours_over_peer["nixl"] == pytest.approx(1.5)
    assert got[2] is rows[2] and not got[2].peer_gbps
    flat = got[0].to_json()  # --json keeps the keys it always had
    assert flat["ours_over_peer"] == got[0].ours_over_peer and flat["ours_gbps"] == pytest.approx(2.0)
    assert TransportRow.from_json(flat) == got[0]
    assert PeerResult("mooncake", unavailable="x").to_json() == {"peer": "mooncake", "unavailable": "x"}


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
    assert row.nbytes == 2048 and row.blocks == 2 and row.checksums is False
    assert row.peer_gbps == pytest.approx(2048 / row.peer_s / 1e9)
