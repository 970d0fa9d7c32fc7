"""Errors as a caller should read them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

__all__ = ["RunTimeout", "Unavailable", "error_message", "load_or_why", "root_cause"]


class Unavailable(Exception):
    """Something this machine, cluster or deployment lacks for the request (root, a tool, a
    Ray head, a live replica); the message says what to do. Not a caller's mistake
    (``ValueError``) and not broken state (``RuntimeError``)."""


class RunTimeout(Unavailable):
    """A run that did not finish within the time its caller gave it (``timeout_s``); the run is
    ended at the manager and the replicas as any other, and the message says what to do."""


def root_cause(exc: BaseException) -> BaseException:
    """The exception a remote call raised, without Ray's task-error wrapping."""
    seen = 0
    while getattr(exc, "cause", None) is not None and seen < 8:  # RayTaskError keeps the original in .cause
        exc = exc.cause  # type: ignore[attr-defined]
        seen += 1
    return exc


def error_message(exc: BaseException) -> str:
    """One line: the root cause's message (Ray's ``ray::Actor.method() (pid=…)`` header dropped)."""
    cause = root_cause(exc)
    lines = [ln for ln in str(cause).splitlines() if ln.strip()]
    return lines[0] if lines else type(cause).__name__


def load_or_why(load: Callable[[], object], folder: str | Path) -> str:
    """Run ``load`` (a manager's ``load_snapshot`` of ``folder``, local or remote); ``""`` when
    it loaded, else why the manager starts empty instead (also logged as a warning): the
    replicas' re-reported holdings then rebuild what it knows."""
    try:
        load()
    except ValueError as exc:  # NOTE: a Ray task error wrapping a ValueError is one too
        why = f"manager snapshot in {folder} not loaded ({error_message(exc)}); starting empty"
        logging.getLogger("graphflow").warning(why)
        return why
    return ""
