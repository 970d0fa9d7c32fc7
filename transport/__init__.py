"""GraphFlow's data plane: move KV block buffers between processes. Imports nothing from graphflow."""

from transport.errors import ChecksumMismatch, PeerUnreachable, TransferTimeout, TransportError, WireFormatError

__all__ = ["ChecksumMismatch", "PeerUnreachable", "TransferTimeout", "TransportError", "WireFormatError"]
