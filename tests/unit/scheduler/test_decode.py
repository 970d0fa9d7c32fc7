from __future__ import annotations

import pytest

from scheduler.calibrate import fit_decode
from scheduler.cost import DecodeModel, LinkMatrix, LinkSpec, PrefillModel, t_transfer
from scheduler.decode import decode_s, send_delay_s
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


def test_a_row_more_on_a_busy_replica_is_priced_against_a_replica_of_its_own():
    rows = {"a": 1, "b": 0}
    # on a: its own steps at 2 rows (no other replica busy), the batch there waits nothing more
    assert decode_s(STEPS, "a", rows, 10, 1000) == pytest.approx(10 * 0.1)
    # on b: its steps slowed by a's, and a's batch slowed by b's
    assert decode_s(STEPS, "b", rows, 10, 1000) == pytest.approx(10 * (0.1 * 1.2 + 0.1 * 0.2))
    # a third row on a costs: its steps at 3 rows, and the two there wait 0.05 s a step
    assert decode_s(STEPS, "a", {"a": 2, "b": 0}, 10, 1000) == pytest.approx(10 * (0.15 + 0.05))
    with pytest.raises(ValueError, match="no row count"):
        decode_s(STEPS, "c", rows, 10, 1000)


def test_contention_is_shared_over_the_other_replicas():
    rows = {"a": 1, "b": 0, "c": 1}
    # b idle, a and c busy: each of b's steps is slowed by 0.1 per busy other; each busy other by 0.1
    assert decode_s(STEPS, "b", rows, 1, 1000) == pytest.approx(0.1 * 1.2 + 2 * 0.1 * 0.1)
    assert decode_s(STEPS, "solo", {"solo": 0}, 4, 1000) == pytest.approx(0.4)


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
