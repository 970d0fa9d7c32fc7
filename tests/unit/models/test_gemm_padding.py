from __future__ import annotations

import itertools

import pytest

from graphflow.models.gemm_padding import GemmPadding

# the head of SmolLM2-135M on this repo's host, one thread (s at 1 … 6 rows)
HEAD_S = [0.0094, 0.0237, 0.0327, 0.0170, 0.0192, 0.0191]


def test_rows_follow_the_table_and_pass_beyond_it():
    pad = GemmPadding((1, 4, 4, 4))
    assert [pad.rows(n) for n in (1, 2, 3, 4, 5, 40)] == [1, 4, 4, 4, 5, 40]
    assert pad.padded == {2: 4, 3: 4}
    assert GemmPadding().rows(3) == 3 and GemmPadding().padded == {}


def test_a_table_that_would_drop_rows_is_refused():
    with pytest.raises(ValueError, match="fewer rows"):
        GemmPadding((1, 1, 4))


def test_each_row_count_pads_to_the_cheapest_from_there_when_clearly_cheaper():
    assert GemmPadding.from_seconds(HEAD_S).to == (1, 4, 4, 4, 5, 6)  # 6 rows save 0.5%: not padded
    assert GemmPadding.from_seconds([10.0, 9.5]).to == (1, 2)  # 5% less is noise, not worth a row
    assert GemmPadding.from_seconds([10.0, 9.5], gain=1.0).to == (2, 2)
    assert GemmPadding.from_seconds([1.0, 3.0, 2.0, 2.5, 1.0]).to == (1, 5, 5, 5, 5)  # the cheapest of all m ≥ n
    # a tiny model's part takes microseconds: halving them is noise, nothing is padded
    assert GemmPadding.from_seconds([4e-5, 9e-5, 2e-5]).to == (1, 2, 3)
    assert GemmPadding.from_seconds([4e-5, 9e-5, 2e-5], min_saving_s=0).to == (3, 3, 3)


@pytest.mark.parametrize(
    ("seconds", "gain", "saving"), [([1.0, 0.0], 0.9, 0.0), ([1.0], 0.0, 0.0), ([1.0], 1.5, 0.0), ([1.0], 0.9, -1.0)]
)
def test_bad_timings_gain_or_saving_are_refused(seconds, gain, saving):
    with pytest.raises(ValueError):
        GemmPadding.from_seconds(seconds, gain, saving)


def test_measure_times_every_row_count_in_rounds_and_plans_from_the_medians(tiny_engine):
    # per round, rows 1 … 4 take 1, 3, 3, 2 s, but round 2 has rows 4 taking 9 s (the median ignores it)
    durations = [1, 3, 3, 2, 1, 3, 3, 9, 1, 3, 3, 2]
    ticks = itertools.accumulate(itertools.chain.from_iterable((0, d) for d in durations))
    pad = GemmPadding.measure(tiny_engine.model, max_rows=4, repeats=3, clock=lambda: float(next(ticks)))
    assert pad.to == (1, 4, 4, 4)


def test_measure_on_a_real_clock_gives_a_valid_table(tiny_engine):
    pad = GemmPadding.measure(tiny_engine.model, max_rows=5, repeats=1)
    assert len(pad.to) == 5 and all(n <= m <= 5 for n, m in enumerate(pad.to, start=1))
    with pytest.raises(ValueError):
        GemmPadding.measure(tiny_engine.model, max_rows=0)
