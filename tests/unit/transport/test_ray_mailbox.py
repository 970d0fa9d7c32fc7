"""The Ray transport's mailbox (a plain class here; an actor in use) never pins a transfer forever."""

from __future__ import annotations

import asyncio

import pytest

from transport.ray_store import _Mailbox


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_taken_transfer_leaves_nothing_behind():
    async def run():
        box = _Mailbox(_Clock())
        assert await box.post(("a", "b", 1), b"h", ["ref"], ttl_s=10) is True
        assert box.held() == 1
        assert await box.take(("a", "b", 1), 1.0) == (b"h", ["ref"])
        assert box.held() == 0 and not box._slots

    asyncio.run(run())


def test_a_transfer_nobody_takes_is_dropped_after_its_ttl():
    async def run():
        clock = _Clock()
        box = _Mailbox(clock)
        await box.post(("a", "b", 1), b"h", ["ref"], ttl_s=10)
        clock.now = 9.9
        assert box.held() == 1
        clock.now = 10.0
        assert box.held() == 0 and not box._slots  # the refs are released

    asyncio.run(run())


def test_a_post_after_the_receiver_gave_up_is_refused_and_kept_nowhere():
    async def run():
        clock = _Clock()
        box = _Mailbox(clock)
        with pytest.raises(TimeoutError):
            await box.take(("a", "b", 2), 0.01)
        assert await box.post(("a", "b", 2), b"h", ["ref"], ttl_s=10) is False
        assert box.held() == 0 and not box._slots
        clock.now = 61.0  # the refusal itself expires too
        assert await box.post(("a", "b", 2), b"h", ["ref"], ttl_s=10) is True

    asyncio.run(run())


def test_a_receiver_that_gave_up_drops_the_waiting_take_and_refuses_posts():
    async def run():
        box = _Mailbox(_Clock())
        waiting = asyncio.ensure_future(box.take(("a", "b", 3), 5.0))
        await asyncio.sleep(0)
        await box.abandon(("a", "b", 3))
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await box.post(("a", "b", 3), b"h", ["ref"], ttl_s=10) is False
        assert box.held() == 0 and not box._slots

    asyncio.run(run())
