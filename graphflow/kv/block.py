"""KV blocks: fixed token spans of a sequence's KV across all layers, content-addressed.

A block's tensor layout (one block, ``block_tokens`` = T):

```
tensor[layers, 2, kv_heads, T, head_dim]
              └ 0 = K, 1 = V
```

Block keys form a hash chain (``graphflow.kv.keys``): a key names a block's tokens and
everything before them, under one model config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from graphflow.kv.errors import ChecksumMismatch
from graphflow.kv.keys import block_key
from transport.checksums import checksum as tensor_checksum
from transport.memory import host_arena

__all__ = [
    "KVBlock",
    "blocks_from_parts",
    "make_block",
    "make_blocks",
    "make_blocks_from_layers",
]


@dataclass(frozen=True, slots=True, eq=False)
class KVBlock:
    """One span of tokens' KV across all layers, plus the metadata that makes it safe to move.

    Attributes:
        key: hash-chain key (see module doc).
        parent_key: key of the block before it (``ROOT_KEY`` for the first).
        token_ids: the tokens this block holds KV for.
        position_offset: absolute position of the first token.
        tensor: ``[layers, 2, kv_heads, num_tokens, head_dim]``, contiguous.
        checksum: xxh3-64 of the tensor's bytes, taken when the block was made.
    """

    key: int
    parent_key: int
    token_ids: tuple[int, ...]
    position_offset: int
    tensor: torch.Tensor
    checksum: int

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def token_range(self) -> tuple[int, int]:
        return (self.position_offset, self.position_offset + self.num_tokens)

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def verify(self) -> None:
        """Raise :class:`ChecksumMismatch` if the tensor's bytes changed since creation."""
        got = tensor_checksum(self.tensor)
        if got != self.checksum:
            raise ChecksumMismatch(
                f"block {self.key:016x} (tokens {self.token_range}) has checksum {got:016x}, "
                f"expected {self.checksum:016x}; it is corrupt and will not be reused"
            )

    def __repr__(self) -> str:
        return (
            f"KVBlock(key={self.key:016x}, tokens={self.token_range}, "
            f"shape={tuple(self.tensor.shape)}, dtype={self.tensor.dtype})"
        )


def make_block(
    parent_key: int,
    token_ids: Sequence[int],
    position_offset: int,
    tensor: torch.Tensor,
    model_key: str,
) -> KVBlock:
    """Build a block, computing its chain key and checksum; the tensor is copied into block
    memory (host tensors: a huge-page slab of :func:`transport.memory.host_arena`)."""
    _check_kv(tensor, len(token_ids))
    if tensor.device.type == "cpu":
        owned = host_arena().copy_of(tensor)
    else:
        owned = tensor.contiguous()
        if owned.untyped_storage().nbytes() != owned.numel() * owned.element_size():
            owned = owned.clone()  # NOTE: a view into a larger buffer would keep it all alive
    return _block(parent_key, token_ids, position_offset, owned, model_key)


def make_blocks(
    parent_key: int,
    token_ids: Sequence[int],
    position_offset: int,
    kv: torch.Tensor,
    model_key: str,
    block_tokens: int,
) -> list[KVBlock]:
    """Cut ``kv`` (``[layers, 2, kv_heads, len(token_ids), head_dim]``) into chained blocks of
    ``block_tokens`` (the last may be shorter), in one copy.

    Host blocks are laid back to back in spans of at most one wire message
    (:data:`transport.layout.MESSAGE_BYTES`), so a transfer of them from the first block sends
    each span in place; a span's memory is freed once none of its blocks is referenced.
    """
    _check_kv(kv, len(token_ids))
    layers, _, heads, _, dim = kv.shape
    return _cut(
        parent_key,
        token_ids,
        position_offset,
        (layers, heads, dim),
        kv,
        lambda part, lo, hi: part.copy_(kv[:, :, :, lo:hi]),
        model_key,
        block_tokens,
    )


def make_blocks_from_layers(
    parent_key: int,
    token_ids: Sequence[int],
    position_offset: int,
    layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
    model_key: str,
    block_tokens: int,
) -> list[KVBlock]:
    """:func:`make_blocks` from each layer's ``(keys, values)``, ``[kv_heads, len(token_ids),
    head_dim]`` each (a cache's own tensors, or views of them), copied straight into the blocks:
    the whole KV is never stacked into one tensor first, so cutting a cache costs the blocks'
    memory and no transient copy of the same size."""
    if not layers:
        raise ValueError("no layers to cut into blocks")
    k0 = layers[0][0]
    if k0.dim() != 3 or k0.shape[1] != len(token_ids):
        raise ValueError(f"layer keys must be [kv_heads, {len(token_ids)}, head_dim], got {tuple(k0.shape)}")

    def fill(part: torch.Tensor, lo: int, hi: int) -> None:
        for i, (k, v) in enumerate(layers):
            part[i, 0].copy_(k[:, lo:hi])
            part[i, 1].copy_(v[:, lo:hi])

    shape = (len(layers), k0.shape[0], k0.shape[2])
    return _cut(parent_key, token_ids, position_offset, shape, k0, fill, model_key, block_tokens)


def _cut(
    parent_key: int,
    token_ids: Sequence[int],
    position_offset: int,
    shape: tuple[int, int, int],
    like: torch.Tensor,
    fill: Callable[[torch.Tensor, int, int], object],
    model_key: str,
    block_tokens: int,
) -> list[KVBlock]:
    """Blocks of ``block_tokens`` over ``token_ids``, each part ``[layers, 2, heads, n, dim]``
    (``shape`` = layers, heads, dim; dtype and device of ``like``) filled by ``fill``."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    cuts = [(lo, min(lo + block_tokens, len(token_ids))) for lo in range(0, len(token_ids), block_tokens)]
    layers, heads, dim = shape
    if like.device.type == "cpu":
        parts = host_arena().empty_run([(layers, 2, heads, hi - lo, dim) for lo, hi in cuts], like.dtype)
    else:
        parts = [torch.empty((layers, 2, heads, hi - lo, dim), dtype=like.dtype, device=like.device) for lo, hi in cuts]
    for part, (lo, hi) in zip(parts, cuts, strict=True):
        fill(part, lo, hi)
    return blocks_from_parts(parent_key, token_ids, position_offset, parts, model_key)


def blocks_from_parts(
    parent_key: int,
    token_ids: Sequence[int],
    position_offset: int,
    parts: Sequence[torch.Tensor],
    model_key: str,
) -> list[KVBlock]:
    """Chained blocks over ``token_ids`` whose tensors are ``parts`` (filled, contiguous, each
    ``[layers, 2, kv_heads, n, head_dim]``, in token order), owned as they are: no copy."""
    if sum(int(p.shape[3]) for p in parts) != len(token_ids):
        raise ValueError(f"the parts hold {sum(int(p.shape[3]) for p in parts)} tokens, not {len(token_ids)}")
    blocks: list[KVBlock] = []
    lo = 0
    for part in parts:
        _check_kv(part, int(part.shape[-2]))
        if not part.is_contiguous():
            raise ValueError("block tensors must be contiguous")
        hi = lo + int(part.shape[3])
        blocks.append(_block(parent_key, token_ids[lo:hi], position_offset + lo, part, model_key))
        parent_key, lo = blocks[-1].key, hi
    return blocks


def _check_kv(tensor: torch.Tensor, num_tokens: int) -> None:
    if tensor.dim() != 5 or tensor.shape[1] != 2:
        raise ValueError(f"block tensor must be [layers, 2, kv_heads, tokens, head_dim], got {tuple(tensor.shape)}")
    if tensor.shape[3] != num_tokens:
        raise ValueError(f"block tensor holds {tensor.shape[3]} tokens but {num_tokens} token ids were given")


def _block(
    parent_key: int, token_ids: Sequence[int], position_offset: int, owned: torch.Tensor, model_key: str
) -> KVBlock:
    ids = tuple(int(t) for t in token_ids)
    return KVBlock(
        key=block_key(parent_key, ids, model_key),
        parent_key=parent_key,
        token_ids=ids,
        position_offset=position_offset,
        tensor=owned,
        checksum=tensor_checksum(owned),
    )
