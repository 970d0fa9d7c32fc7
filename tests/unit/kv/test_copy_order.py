from __future__ import annotations

import pytest

from graphflow.kv.copy_order import CopyOrder, Stamps


def test_stamps_only_grow_even_when_the_clock_stands_still_or_steps_back():
    ticks = iter([100, 100, 90, 200])
    stamp = Stamps(lambda: next(ticks))
    assert [stamp(), stamp(), stamp(), stamp()] == [100, 101, 102, 200]


def test_a_change_older_than_the_last_applied_to_a_block_is_reported_with_what_that_left():
    order = CopyOrder()
    order.applied("r0", [1, 2], 10, held=True)
    order.applied("r0", [2], 12, held=False)
    order.applied("r0", [2], 11, held=True)  # older than what is remembered: ignored
    assert order.newer("r0", [1, 2, 3], 11) == {2: False}
    assert order.newer("r0", [1, 2], 9) == {1: True, 2: False}
    assert order.newer("r1", [1], 1) == {} and order.newer("r0", [1], 0) == {}  # another replica; unstamped
    order.forget("r0")
    assert order.newer("r0", [1, 2], 9) == {}


def test_only_the_latest_blocks_are_remembered():
    order = CopyOrder(keys_remembered=2)
    for key in (1, 2, 3):
        order.applied("r0", [key], key, held=True)
    assert order.remembered("r0") == 2 and order.newer("r0", [1, 2, 3], 0 + 1) == {2: True, 3: True}
    with pytest.raises(ValueError, match="keys_remembered must be 1 or more, got 0"):
        CopyOrder(0)
