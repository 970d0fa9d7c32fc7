"""KV blocks to and from the transport wire format (Arrow header + raw buffers).

The same frames go over a transport and into files; a file written here can be read back in
another process and its blocks are checksum-verified on the way in.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from graphflow.kv.block import KVBlock
from transport.wire import BlockHeader, WireLimits, read_frame, write_frame

__all__ = ["from_wire", "load_blocks", "save_blocks", "to_wire"]


def to_wire(blocks: Sequence[KVBlock]) -> tuple[list[BlockHeader], list[torch.Tensor]]:
    """Headers and host tensors for ``blocks`` (device tensors are copied to pinned host memory)."""
    headers = [
        BlockHeader(
            key=b.key,
            parent_key=b.parent_key,
            position_offset=b.position_offset,
            token_ids=b.token_ids,
            dtype=str(b.tensor.dtype).removeprefix("torch."),
            shape=tuple(b.tensor.shape),
            nbytes=b.nbytes,
            checksum=b.checksum,
        )
        for b in blocks
    ]
    return headers, [b.tensor if b.tensor.device.type == "cpu" else _pinned_copy(b.tensor) for b in blocks]


def _pinned_copy(t: torch.Tensor) -> torch.Tensor:
    """A device tensor copied into page-locked host memory (the transport reads it from there;
    a pinned buffer lets the device copy engine write it directly)."""
    host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
    host.copy_(t)
    return host


def from_wire(headers: Sequence[BlockHeader], tensors: Sequence[torch.Tensor]) -> list[KVBlock]:
    """Blocks from received headers and (already checksum-verified) tensors."""
    return [
        KVBlock(
            key=h.key,
            parent_key=h.parent_key,
            token_ids=h.token_ids,
            position_offset=h.position_offset,
            tensor=t,
            checksum=h.checksum,
        )
        for h, t in zip(headers, tensors, strict=True)
    ]


def save_blocks(path: str | Path, blocks: Sequence[KVBlock]) -> int:
    """Write blocks to one frame file; returns the bytes written."""
    headers, tensors = to_wire(blocks)
    with open(path, "wb") as f:
        return write_frame(f, headers, tensors)


def load_blocks(path: str | Path, limits: WireLimits | None = None) -> list[KVBlock]:
    """Read blocks written by :func:`save_blocks`; raises ``ChecksumMismatch`` on corruption."""
    with open(path, "rb") as f:
        return from_wire(*read_frame(f, limits))
