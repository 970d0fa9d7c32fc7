import pytest

from graphflow.bench.sweep_points import SweepPoint, summarize
from scheduler.policy import Decision, Option

R, T = Option.RECOMPUTE, Option.TRANSFER


def _point(chose: Option, recompute_s: float, transfer_s: float, predicted: float = 1.0) -> SweepPoint:
    measured = {R: recompute_s, T: transfer_s}
    d = Decision(chose, "dst", "src", {R: predicted, T: predicted}, {R: 0.0, T: 0.0}, {R: 0, T: 0}, "test")
    d = d.with_measured(measured[chose], measured)
    return SweepPoint("m", "a>b", 1024, 1 << 20, 1.0, recompute_s, transfer_s, 0.1, 0.1, d)


def test_a_point_is_right_within_five_percent_of_the_best_option():
    assert _point(T, 2.0, 1.0).right and _point(T, 2.0, 1.0).oracle is T
    assert _point(R, 1.0, 1.04).right  # recompute was the best option
    assert _point(T, 1.0, 1.04).right and not _point(T, 1.0, 1.06).right
    assert _point(R, 1.0, 2.0, predicted=1.5).rel_error == pytest.approx(0.5)


def test_the_summary_and_the_csv_come_from_the_points():
    points = [_point(T, 2.0, 1.0), _point(T, 1.0, 2.0)]
    s = summarize(points)
    assert (s.points, s.decision_accuracy) == (2, 0.5)
    assert s.regret == pytest.approx((1.0 + 2.0 - 1.0 - 1.0) / 2.0)
    row = points[1].csv_row()
    assert (row["decision"], row["oracle"], row["right"]) == ("transfer", "recompute", False)
    assert "src" not in row  # two-process points have no replica pair
    assert "pairs" not in s.to_json()
    with pytest.raises(ValueError, match="no points"):
        summarize([])
