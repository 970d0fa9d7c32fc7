"""Errors of the KV layer that a caller can meet at its edges."""

from __future__ import annotations

from transport.errors import ChecksumMismatch

__all__ = ["ChecksumMismatch", "IncompatibleState", "MissingBlocks"]


class IncompatibleState(ValueError):
    """A KV state was offered to a model/config it was not computed with; it is never reused."""


class MissingBlocks(LookupError):
    """A replica was asked for blocks it no longer holds (evicted since the manager last heard)."""
