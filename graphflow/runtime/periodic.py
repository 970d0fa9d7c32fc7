"""A daemon thread that does one thing every few seconds, for the actors' housekeeping."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["every"]


def every(period_s: float, step: Callable[[], object], stop: threading.Event, what: str) -> threading.Thread:
    """Call ``step`` every ``period_s`` seconds until ``stop`` is set, on a daemon thread named
    ``graphflow-<what>``. A step that raises is logged once (``cannot <what>``) and tried again
    at the next period."""

    def loop() -> None:
        warned = False
        while not stop.wait(period_s):
            try:
                step()
            except Exception as exc:  # NOTE: housekeeping that fails only waits for the next period
                if not warned:
                    logging.getLogger("graphflow").warning(f"cannot {what} ({exc!r}); retrying")
                    warned = True

    thread = threading.Thread(target=loop, name=f"graphflow-{what.replace(' ', '-')}", daemon=True)
    thread.start()
    return thread
