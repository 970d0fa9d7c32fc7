import threading

from graphflow.runtime.arrivals import Arrivals


def test_a_waiter_wakes_when_its_prefix_lands_whichever_call_came_first():
    arrivals = Arrivals()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(arrivals.wait([1, 2, 3], timeout_s=10)))
    waiter.start()
    arrivals.landed([1, 2, 3])
    waiter.join(5)
    assert woke == [True]
    arrivals.landed([4, 5])  # landed before anyone waits: a later waiter returns at once
    assert arrivals.wait([4, 5], timeout_s=0)


def test_a_prefix_that_never_lands_times_out_and_other_prefixes_do_not_wake_it():
    arrivals = Arrivals()
    arrivals.landed([1, 2])
    assert not arrivals.wait([1, 2, 3], timeout_s=0.05)


def test_landed_entries_are_dropped_after_keep_s():
    now = [0.0]
    arrivals = Arrivals(clock=lambda: now[0], keep_s=10)
    arrivals.landed([1])
    now[0] = 11.0
    arrivals.landed([2])  # registering another prunes the stale one
    assert len(arrivals) == 1
