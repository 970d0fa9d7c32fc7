"""A request's KV cache with its room reserved up front, which becomes stored blocks in place.

transformers' ``DynamicCache`` grows every layer by concatenation: each forward allocates each
layer anew and copies what it held (a 4K-token prefill run in 128-token chunks copies the cache
32 times), and the freed sizes rarely fit the next, larger ones. When the request is done,
cutting its KV into stored blocks copies it once more, so a finished node holds its KV twice
until its cache is dropped: 16 agents over one shared root held their private suffixes twice.

A :class:`RowCache` reserves one buffer, ``[layers, 2, kv_heads, capacity, head_dim]``, for
the tokens the request will hold (the engine loop knows them: the prompt plus what it will
generate), writes each forward's keys and values into it in place, and hands each layer out as
a view. :meth:`RowCache.into_blocks` then rewrites the buffer, in place, into the layout of the
stored blocks (each block ``[layers, 2, kv_heads, tokens, head_dim]``, contiguous, one after
another) through one transient copy of the tokens held, and returns the blocks: the KV kept for
reuse is the request's own memory, and the cache is spent.

```
buffer, as the forward writes it (layer-major):   as blocks, after into_blocks (block-major):
L0 K [h0: t0 t1 ... tn .. cap] [h1: ...]          block 0: L0 K t0..t15, L0 V, L1 K, ... L29 V
L0 V [h0: ...]                                    block 1: L0 K t16..t31, ...
...                                               ...
L29 V [...]                                       last block (n mod 16 tokens), then unused room
```
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from graphflow.kv.block import KVBlock, blocks_from_parts
from graphflow.models.scratch import ScratchBuffer
from transport.memory import advise_huge_pages

__all__ = ["RowCache"]

# NOTE: one rewrite at a time per process, through one kept scratch buffer: nodes finishing
# together (agents over one root) then share one transient instead of each growing the heap by
# its own (freed heap chunks of a size were not found again by the next). Rewrites larger than
# _SCRATCH_MAX_BYTES (a long context's, mapped and unmapped whole by malloc) get a buffer of their own.
_REWRITE = threading.Lock()
_SCRATCH_MAX_BYTES = 32 << 20
_scratch = ScratchBuffer()
# NOTE: rooms this large (a long context's, mapped on their own by malloc and unmapped when they
# die) get huge pages: their blocks are the ones sent to other replicas, and same-host sends read
# the sender's pages one at a time (transport.memory). Smaller rooms stay on 4 KiB pages, where a
# partly used last huge page would cost up to 2 MiB per request.
_HUGE_ROOM_BYTES = 32 << 20


def _transient(shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` for a rewrite (the caller holds ``_REWRITE``)."""
    nbytes = math.prod(int(d) for d in shape) * like.element_size()
    if nbytes > _SCRATCH_MAX_BYTES:
        return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
    return _scratch.view(shape, like)


class _ReservedLayer(DynamicLayer):
    """One layer of a :class:`RowCache`: keys and values are views of its buffer."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self._room_k, self._room_v = keys, values  # [1, kv_heads, capacity, head_dim]
        self.held = 0
        self.device = keys.device
        self.keys, self.values = keys[:, :, :0], values[:, :, :0]
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # NOTE: the room exists from the start

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._room_k is None:
            raise RuntimeError("this cache was turned into stored blocks; it holds nothing any more")
        end = self.held + key_states.shape[-2]
        if end > self._room_k.shape[-2]:
            raise ValueError(f"the request needs room for {end} tokens but its cache reserved {self._room_k.shape[-2]}")
        self._room_k[:, :, self.held : end].copy_(key_states)
        self._room_v[:, :, self.held : end].copy_(value_states)
        self.held = end
        self.keys, self.values = self._room_k[:, :, :end], self._room_v[:, :, :end]
        return self.keys, self.values

    def spend(self) -> None:
        self._room_k = self._room_v = None  # type: ignore[assignment]
        self.keys = self.values = None
        self.is_initialized = False


class RowCache(DynamicCache):
    """A batch-1 ``DynamicCache`` over a buffer of ``capacity`` tokens (see the module doc).

    Args:
        config: the model's config (its layer count, KV heads and head size).
        capacity: tokens the cache can hold; writing more raises ``ValueError``.
        dtype, device: of the buffer (the model's).
    """

    def __init__(self, config: Any, capacity: int, dtype: torch.dtype, device: str | torch.device = "cpu") -> None:
        if capacity < 1:
            raise ValueError(f"a row cache needs room for at least one token, got {capacity}")
        text = config.get_text_config(decoder=True)
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        shape = (text.num_hidden_layers, 2, text.num_key_value_heads, capacity, head_dim)
        self._room = torch.empty(shape, dtype=dtype, device=device)
        if self._room.numel() * self._room.element_size() >= _HUGE_ROOM_BYTES:
            advise_huge_pages(self._room)  # NOTE: see _HUGE_ROOM_BYTES
        super().__init__(config=config)
        self.layers = [_ReservedLayer(self._room[i, 0][None], self._room[i, 1][None]) for i in range(shape[0])]

    @property
    def capacity(self) -> int:
        return int(self._room.shape[3])

    @torch.inference_mode()
    def into_blocks(
        self,
        token_ids: Sequence[int],
        position_offset: int,
        parent_key: int,
        model_key: str,
        block_tokens: int,
    ) -> list[KVBlock]:
        """The held tokens as chained stored blocks whose tensors are this cache's buffer; the
        cache is spent (any further use raises). ``token_ids`` are the tokens it holds, from
        ``position_offset`` on, after the block ``parent_key``."""
        held = self.get_seq_length()
        if len(token_ids) != held:
            raise ValueError(f"the cache holds {held} tokens but {len(token_ids)} token ids were given")
        if held == 0:
            raise ValueError("an empty cache has no blocks")
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be positive, got {block_tokens}")
        layers, _, heads, _, dim = self._room.shape
        flat = self._room.view(-1)
        parts, at = [], 0
        with _REWRITE:
            kv = self._room[:, :, :, :held]
            kv = _transient(kv.shape, kv).copy_(kv)  # NOTE: the one transient copy; the buffer is rewritten below
            for lo in range(0, held, block_tokens):
                hi = min(lo + block_tokens, held)
                size = layers * 2 * heads * (hi - lo) * dim
                part = flat[at : at + size].view(layers, 2, heads, hi - lo, dim)
                part.copy_(kv[:, :, :, lo:hi])
                parts.append(part)
                at += size
            del kv
        for layer in self.layers:
            assert isinstance(layer, _ReservedLayer)
            layer.spend()
        return blocks_from_parts(parent_key, token_ids, position_offset, parts, model_key)
