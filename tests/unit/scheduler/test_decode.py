from __future__ import annotations

import pytest

from scheduler.calibrate import fit_decode
from scheduler.cost import DecodeModel, LinkMatrix, LinkSpec, PrefillModel, t_transfer
from scheduler.decode import Batch, decode_s, send_delay_s, shared_tokens
from scheduler.policy import Option, Policy, RemoteCopy, StateRequest, decide, place

# a step: 0.1 s for 1 or 2 rows, 0.2 s for 4, at 1,000 context tokens; twice that at 3,000
STEPS = DecodeModel((1, 2, 4), (1000, 3000), ((0.1, 0.1, 0.2), (0.2, 0.2, 0.4)), contention=1.2)


def test_step_interpolates_rows_then_context_and_extends_the_outer_segments():
    assert STEPS.step_s(0, 1000) == 0.0
    assert STEPS.step_s(2, 1000) == pytest.approx(0.1)
    assert STEPS.step_s(3, 1000) == pytest.approx(0.15)
    assert STEPS.step_s(8, 1000) == pytest.approx(0.4)  # 4 → 8 rows: the 2 → 4 slope extended
    assert STEPS.step_s(1, 2000) == pytest.approx(0.15)
    assert STEPS.step_s(1, 5000) == pytest.approx(0.3)
    assert STEPS.step_s(1, 0) == pytest.approx(0.05)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rows": (2, 1), "contexts": (1, 2), "seconds": ((0.1, 0.1), (0.1, 0.1))},
        {"rows": (1, 2), "contexts": (2, 2), "seconds": ((0.1, 0.1), (0.1, 0.1))},
        {"rows": (1, 2), "contexts": (1, 2), "seconds": ((0.1,), (0.1, 0.1))},
        {"rows": (1, 2), "contexts": (1, 2), "seconds": ((0.1, 0.1), (0.1, 0.1)), "contention": 0.9},
    ],
)
def test_a_decode_model_refuses_what_it_cannot_interpolate(kwargs):
    with pytest.raises(ValueError):
        DecodeModel(**kwargs)


def test_fit_takes_medians_and_never_lets_more_rows_cost_less():
    samples = [(1, 100, 0.10), (1, 100, 0.30), (1, 100, 0.12), (4, 100, 0.09), (1, 900, 0.2), (4, 900, 0.5)]
    m = fit_decode(samples, contention=0.8)
    assert m.rows == (1, 4) and m.contexts == (100, 900)
    assert m.seconds == ((0.12, 0.12), (0.2, 0.5))
    assert m.contention == 1.0  # faster together is noise: no speed-up is modelled
    with pytest.raises(ValueError, match="two context"):
        fit_decode([(1, 100, 0.1), (4, 100, 0.2)])
    with pytest.raises(ValueError, match="no decode step measured"):
        fit_decode([(1, 100, 0.1), (4, 100, 0.2), (1, 900, 0.2), (1, 900, 0.2)])


ROOT = ("root", 992)  # a stored prefix's key and tokens


def test_a_row_more_on_a_busy_replica_is_priced_against_a_replica_of_its_own():
    busy = {"a": Batch(1, 1000, frozenset({"root"})), "b": Batch()}
    # on a, continuing the prefix a's row reads: its own steps at 2 rows over 1,008 tokens (no
    # other replica busy), 0.1004 s, and the batch there waits only for its 8 tokens more a step
    assert decode_s(STEPS, "a", busy, 10, 1000, ROOT) == pytest.approx(10 * (0.1004 + 0.0004))
    # on b: its steps slowed by a's, and a's batch slowed by b's
    assert decode_s(STEPS, "b", busy, 10, 1000, ROOT) == pytest.approx(10 * (0.1 * 1.2 + 0.1 * 0.2))
    # a third row on a costs: its steps at 3 rows, and the two there wait about 0.05 s a step
    two = {"a": Batch(2, 1000, frozenset({"root"})), "b": Batch()}
    assert decode_s(STEPS, "a", two, 10, 1000, ROOT) == pytest.approx(10 * (0.1506 + 0.0506))
    with pytest.raises(ValueError, match="no batch"):
        decode_s(STEPS, "c", busy, 10, 1000)
    with pytest.raises(ValueError, match="does not fit"):
        decode_s(STEPS, "a", busy, 10, 1000, ("root", 2000))


def test_a_row_over_a_prefix_no_row_there_reads_adds_its_whole_context():
    busy = {"a": Batch(1, 1000, frozenset({"other"})), "b": Batch()}
    # a's step now reads 2,000 tokens: 0.15 s at 2 rows, and a's row waits 0.05 s more a step
    assert decode_s(STEPS, "a", busy, 10, 1000, ROOT) == pytest.approx(10 * (0.15 + 0.05))
    assert decode_s(STEPS, "a", busy, 10, 1000, None) == pytest.approx(10 * (0.15 + 0.05))
    # so the sibling of a's row goes where that row's prefix is read already
    sibling = {"a": Batch(4, 4000, frozenset({"p", "q", "r", "s"})), "b": Batch(1, 1000, frozenset({"root"}))}
    assert decode_s(STEPS, "b", sibling, 10, 1000, ROOT) < decode_s(STEPS, "a", sibling, 10, 1000, ROOT)


def test_contention_is_shared_over_the_other_replicas():
    rows = {"a": Batch(1, 1000), "b": Batch(), "c": Batch(1, 1000)}
    # b idle, a and c busy: each of b's steps is slowed by 0.1 per busy other; each busy other by 0.1
    assert decode_s(STEPS, "b", rows, 1, 1000) == pytest.approx(0.1 * 1.2 + 2 * 0.1 * 0.1)
    assert decode_s(STEPS, "solo", {"solo": Batch()}, 4, 1000) == pytest.approx(0.4)


def test_shared_tokens_are_what_the_node_continues_from_stored_blocks():
    pol = Policy(PrefillModel(0.0, 1.0, 0.0))
    reuse = decide(StateRequest("a", 1000, 100, local_tokens=992), pol)
    moved = decide(StateRequest("b", 1000, 100, remote=(RemoteCopy("a", 992, LinkSpec("x", 1e9, 0.0), "addr"),)), pol)
    fresh = decide(StateRequest("c", 1000, 100), pol)
    assert (reuse.option, moved.option, fresh.option) == (Option.REUSE, Option.TRANSFER, Option.RECOMPUTE)
    assert [shared_tokens(d) for d in (reuse, moved, fresh)] == [992, 992, 0]
    with pytest.raises(ValueError, match="non-negative"):
        Batch(-1, 0)


def test_a_send_holds_up_a_busy_source_only():
    req = StateRequest("b", 1000, 100, remote=(RemoteCopy("a", 992, LinkSpec("x", 1e6, 0.0), "addr"),))
    d = decide(req, Policy(PrefillModel(0.0, 1.0, 0.0)))
    assert d.option is Option.TRANSFER
    link = LinkSpec("x", 1e6, 0.0)
    links = LinkMatrix.uniform(link)
    assert send_delay_s(d, {"a": 1, "b": 0}, 100, links) == pytest.approx(t_transfer(992 * 100, link))
    assert send_delay_s(d, {"a": 0, "b": 0}, 100, links) == 0.0


def test_place_adds_the_extra_cost_of_each_decision():
    pol = Policy(PrefillModel(0.0, 1e-3, 0.0))
    here = StateRequest("a", 1000, 100, local_tokens=992)
    there = StateRequest("b", 1000, 100, local_tokens=992)
    assert place([here, there], {}, pol).replica == "a"  # a tie goes to the first
    assert place([here, there], {}, pol, extra_s=lambda d: 1.0 if d.replica == "a" else 0.0).replica == "b"
