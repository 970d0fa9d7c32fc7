"""Errors as a caller should read them."""

from __future__ import annotations

__all__ = ["Unavailable", "error_message", "root_cause"]


class Unavailable(Exception):
    """Something this machine, cluster or deployment lacks for the request (root, a tool, a
    Ray head, a live replica); the message says what to do. Not a caller's mistake
    (``ValueError``) and not broken state (``RuntimeError``)."""


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
