"""KV blocks: fixed token spans of a sequence's KV across all layers, content-addressed.

A block's tensor layout (one block, ``block_tokens`` = T):

```
tensor[layers, 2, kv_heads, T, head_dim]
              └ 0 = K, 1 = V
```

Block keys form a hash chain, as in vLLM's prefix caching and LMCache:

```
key_0 = xxh64(ROOT_KEY  | model_key | tokens[0:T])
key_1 = xxh64(key_0     | model_key | tokens[T:2T])
...
```

so a key names a block's tokens *and everything before them* under one model config, and is
the same in every process. Only the last block of a sequence may be partial (< T tokens).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import xxhash

from graphflow.kv.errors import ChecksumMismatch
from transport.wire import checksum as tensor_checksum

__all__ = ["ROOT_KEY", "KVBlock", "block_key", "chain_keys", "make_block"]

ROOT_KEY = 0
_U64 = struct.Struct("<Q")


def block_key(parent_key: int, token_ids: Sequence[int], model_key: str) -> int:
    """Deterministic 64-bit key of a block: ``xxh64(parent_key, model_key, token_ids)``."""
    h = xxhash.xxh64()
    h.update(_U64.pack(parent_key))
    encoded = model_key.encode()
    h.update(_U64.pack(len(encoded)))
    h.update(encoded)
    h.update(np.asarray(token_ids, dtype="<i4").tobytes())
    return h.intdigest()


def chain_keys(token_ids: Sequence[int], model_key: str, block_tokens: int, parent_key: int = ROOT_KEY) -> list[int]:
    """Keys of the blocks covering ``token_ids``, chained from ``parent_key``."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    keys: list[int] = []
    for start in range(0, len(token_ids), block_tokens):
        parent_key = block_key(parent_key, token_ids[start : start + block_tokens], model_key)
        keys.append(parent_key)
    return keys


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
    """Build a block, computing its chain key and checksum; the tensor is made contiguous."""
    if tensor.dim() != 5 or tensor.shape[1] != 2:
        raise ValueError(f"block tensor must be [layers, 2, kv_heads, tokens, head_dim], got {tuple(tensor.shape)}")
    if tensor.shape[3] != len(token_ids):
        raise ValueError(f"block tensor holds {tensor.shape[3]} tokens but {len(token_ids)} token ids were given")
    tensor = tensor.contiguous()
    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        # NOTE: a view into a larger buffer would keep that whole buffer alive; own the bytes.
        tensor = tensor.clone()
    ids = tuple(int(t) for t in token_ids)
    return KVBlock(
        key=block_key(parent_key, ids, model_key),
        parent_key=parent_key,
        token_ids=ids,
        position_offset=position_offset,
        tensor=tensor,
        checksum=tensor_checksum(tensor),
    )
