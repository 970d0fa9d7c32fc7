"""Errors of the KV layer that a caller can meet at its edges."""

from __future__ import annotations

from transport.errors import ChecksumMismatch

__all__ = ["ChecksumMismatch", "IncompatibleState"]


class IncompatibleState(ValueError):
    """A KV state was offered to a model/config it was not computed with; it is never reused."""
