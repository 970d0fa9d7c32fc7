"""Errors raised at the transport's I/O edge.

Every transport failure a caller can see is a :class:`TransportError`; the subclasses say
which kind, so the KV layer can fall back to recompute on any of them.
"""

from __future__ import annotations

__all__ = [
    "ChecksumMismatch",
    "TransferAborted",
    "PeerUnreachable",
    "TransferTimeout",
    "TransportError",
    "WireFormatError",
]


class TransportError(RuntimeError):
    """A transfer failed; the received blocks (if any) must not be used."""


class PeerUnreachable(TransportError):
    """The peer could not be reached or went away during the transfer."""


class TransferTimeout(TransportError):
    """The transfer did not complete within its configured timeout."""


class TransferAborted(TransportError):
    """The receive was called off before it completed (its sender failed); nothing was received."""


class ChecksumMismatch(TransportError):
    """Bytes that arrived (or were loaded) do not match the checksum they were sent with."""


class WireFormatError(TransportError):
    """A header does not match the wire schema, or announces sizes outside the limits."""
