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


def test_a_change_older_than_a_forgotten_one_is_taken_the_safe_way():
    """Past the window, a block's last change may be newer than a stale change and no longer
    remembered: the stale admit must not list it, the stale eviction must be applied."""
    order = CopyOrder(keys_remembered=2)
    order.applied("r0", [1], 10, held=True)
    order.applied("r0", [1], 30, held=False)  # block 1 evicted at 30 ...
    order.applied("r0", [2, 3], 31, held=True)  # ... then forgotten
    assert order.remembered("r0") == 2 and order.newer("r0", [1], 20) == {}
    assert order.unsure("r0", [1, 2], 20) == [1]  # block 2 is remembered: newer() answers for it
    assert order.unsure("r0", [1], 30) == [] and order.unsure("r0", [1], 0) == []  # not older; unstamped
    order.applied("r0", [1], 20, held=True)  # an unsure block stays unsure
    assert order.unsure("r0", [1], 25) == [1]
    order.applied("r0", [1], 40, held=True)  # newer than everything forgotten: remembered again
    assert order.unsure("r0", [1], 25) == [] and order.newer("r0", [1], 25) == {1: True}
    order.forget("r0")
    assert order.unsure("r0", [1, 2], 5) == []
