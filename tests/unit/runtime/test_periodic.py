"""``every``: a step repeated on a daemon thread until its event is set, a failing one logged once."""

from __future__ import annotations

import logging
import threading

import pytest

from graphflow.runtime.periodic import every


def test_steps_repeat_until_stopped_and_a_failure_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    stop, calls = threading.Event(), []

    def step() -> None:
        calls.append(len(calls))
        if len(calls) >= 4:
            stop.set()
        if len(calls) % 2:
            raise OSError("disk full")

    with caplog.at_level(logging.WARNING, logger="graphflow"):
        thread = every(0.01, step, stop, "tidy up")
        thread.join(5.0)
    assert not thread.is_alive() and thread.daemon and thread.name == "graphflow-tidy-up"
    assert calls == [0, 1, 2, 3]  # a failing step does not stop the next ones
    assert [r.getMessage() for r in caplog.records] == ["cannot tidy up (OSError('disk full')); retrying"]
