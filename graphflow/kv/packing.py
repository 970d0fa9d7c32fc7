"""Pack a transformers KV cache into blocks, and rebuild a cache from blocks.

A transformers ``DynamicCache`` holds, per layer, ``keys``/``values`` of shape
``[batch=1, kv_heads, seq, head_dim]``. Packing copies them along ``seq`` straight into blocks
of ``block_tokens`` tokens, each ``[layers, 2, kv_heads, block_tokens, head_dim]``;
unpacking concatenates blocks back along ``seq``. Both directions
copy bytes exactly: a rebuilt cache is bit-identical to the packed one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from graphflow.kv.block import KVBlock, make_blocks_from_layers
from graphflow.kv.errors import IncompatibleState
from graphflow.kv.keys import ROOT_KEY, block_key
from graphflow.kv.state import ModelIdentity

if TYPE_CHECKING:  # NOTE: transformers is imported where a cache is made (the client never makes one)
    from transformers import DynamicCache, PretrainedConfig

__all__ = [
    "batch_cache",
    "cache_from_tensor",
    "blocks_to_cache",
    "cache_length",
    "cache_nbytes",
    "cache_to_blocks",
    "layer_tensors",
    "layer_views",
    "stack_cache",
    "validate_chain",
]


def cache_length(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


def cache_nbytes(cache: DynamicCache) -> int:
    """Bytes held by the cache's K and V tensors (real tensor sizes)."""
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layer_tensors(cache))


def layer_tensors(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(keys, values)`` per layer, each ``[batch, kv_heads, seq, head_dim]``."""
    pairs = []
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            raise ValueError("the cache is empty or not a full-attention KV cache; prefill some tokens first")
        pairs.append((keys, values))
    if not pairs:
        raise ValueError("the cache has no layers; prefill some tokens first")
    return pairs


def layer_views(
    cache: DynamicCache, start: int = 0, end: int | None = None, *, row: int | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Views of each layer's keys and values over tokens ``[start, end)``, ``[kv_heads, tokens,
    head_dim]`` each (of batch ``row`` when the cache holds several; batch-1 caches need no
    ``row``). Nothing is copied."""
    pairs = layer_tensors(cache)
    batch = pairs[0][0].shape[0]
    if row is None and batch != 1:
        raise ValueError(f"a batch-{batch} cache needs the row to pack")
    r = row or 0
    if not 0 <= r < batch:
        raise ValueError(f"row {r} is outside the cache's batch of {batch}")
    return [(k[r, :, start:end], v[r, :, start:end]) for k, v in pairs]


def stack_cache(cache: DynamicCache, start: int = 0, end: int | None = None, *, row: int | None = None) -> torch.Tensor:
    """The cache's tokens ``[start, end)`` as one ``[layers, 2, kv_heads, tokens, head_dim]`` tensor
    (a copy; see :func:`layer_views` for the row)."""
    return torch.stack([torch.stack(kv) for kv in layer_views(cache, start, end, row=row)])


def cache_to_blocks(
    cache: DynamicCache,
    token_ids: Sequence[int],
    identity: ModelIdentity,
    block_tokens: int = 16,
    *,
    start: int = 0,
    parent_key: int = ROOT_KEY,
    row: int | None = None,
) -> list[KVBlock]:
    """Cut the cache's tokens ``[start, len(token_ids))`` into chained blocks.

    Args:
        cache: a batch-1 cache holding KV for exactly ``token_ids``.
        token_ids: all tokens in the cache, from position 0.
        identity: the model the cache came from; its ``model_key`` goes into every key.
        block_tokens: tokens per block; only the last block may be shorter.
        start: first token to pack (the tokens before it are already in blocks); must be a
            multiple of ``block_tokens`` so block boundaries stay aligned.
        parent_key: key of the block that ends at ``start`` (``ROOT_KEY`` when ``start == 0``).
        row: which batch row to pack, for a cache that holds several.
    """
    n = cache_length(cache)
    if n != len(token_ids):
        raise ValueError(f"cache holds {n} tokens but {len(token_ids)} token ids were given")
    if start % block_tokens:
        raise ValueError(f"start {start} is not a multiple of block_tokens {block_tokens}")
    # NOTE: straight from the layers: stacking the cache first would hold a second copy of it
    layers = layer_views(cache, start, row=row)
    ids = list(token_ids[start:n])
    return make_blocks_from_layers(parent_key, ids, start, layers, identity.model_key, block_tokens)


def validate_chain(blocks: Sequence[KVBlock], identity: ModelIdentity, *, verify_bytes: bool = True) -> None:
    """Check blocks form one contiguous chain of this model, from position 0.

    Raises:
        IncompatibleState: a block's key is not this model's hash of its tokens.
        ValueError: wrong shape/dtype, broken chain, or a partial block before the end.
        ChecksumMismatch: a block's bytes changed (when ``verify_bytes``).
    """
    layout = identity.layout
    expected_pos = 0
    expected_parent = ROOT_KEY
    for i, b in enumerate(blocks):
        if block_key(b.parent_key, b.token_ids, identity.model_key) != b.key:
            raise IncompatibleState(
                f"block {b.key:016x} was not computed by {identity.model_id} with config {identity.config_hash}; "
                "recompute it with this model"
            )
        if b.parent_key != expected_parent or b.position_offset != expected_pos:
            raise ValueError(f"block {i} ({b.key:016x}) does not continue the chain at position {expected_pos}")
        if tuple(b.tensor.shape) != layout.block_shape(b.num_tokens):
            raise ValueError(
                f"block {b.key:016x} has shape {tuple(b.tensor.shape)}, "
                f"model expects {layout.block_shape(b.num_tokens)}"
            )
        if str(b.tensor.dtype).removeprefix("torch.") != layout.dtype:
            raise ValueError(f"block {b.key:016x} has dtype {b.tensor.dtype}, model uses {layout.dtype}")
        if i < len(blocks) - 1 and b.num_tokens != blocks[0].num_tokens:
            raise ValueError(f"block {i} is partial ({b.num_tokens} tokens) but is not the last block")
        if verify_bytes:
            b.verify()
        expected_parent, expected_pos = b.key, b.token_range[1]


def blocks_to_cache(
    blocks: Sequence[KVBlock],
    identity: ModelIdentity,
    config: PretrainedConfig,
    device: str | torch.device = "cpu",
    *,
    verify_bytes: bool = True,
) -> DynamicCache:
    """Rebuild a batch-1 ``DynamicCache`` from a validated chain of blocks (see :func:`validate_chain`;
    ``verify_bytes=False`` skips the checksums, for blocks the caller has just verified)."""
    if not blocks:
        raise ValueError("no blocks to rebuild a cache from")
    validate_chain(blocks, identity, verify_bytes=verify_bytes)
    return cache_from_tensor(torch.cat([b.tensor for b in blocks], dim=3), config, device)


def batch_cache(kvs: Sequence[torch.Tensor], config: PretrainedConfig) -> DynamicCache:
    """A batch-``len(kvs)`` ``DynamicCache``, row ``i`` holding ``kvs[i]``
    ``[layers, 2, kv_heads, tokens, head_dim]`` (all of one length). The rows are copied: a
    transformers cache holds each row's prefix in its own memory, shared or not."""
    if not kvs or len({tuple(kv.shape) for kv in kvs}) != 1:
        raise ValueError("batch_cache needs one or more KV tensors of one shape")
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for layer in range(kvs[0].shape[0]):
        keys = torch.stack([kv[layer, 0] for kv in kvs])
        values = torch.stack([kv[layer, 1] for kv in kvs])
        cache.update(keys, values, layer)
    return cache


def cache_from_tensor(kv: torch.Tensor, config: PretrainedConfig, device: str | torch.device = "cpu") -> DynamicCache:
    """A batch-1 ``DynamicCache`` holding ``kv`` ``[layers, 2, kv_heads, tokens, head_dim]``."""
    from transformers import DynamicCache

    full = kv.to(device)
    cache = DynamicCache(config=config)
    for layer in range(full.shape[0]):
        cache.update(full[layer, 0].unsqueeze(0).contiguous(), full[layer, 1].unsqueeze(0).contiguous(), layer)
    return cache
