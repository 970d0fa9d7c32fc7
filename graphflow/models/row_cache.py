"""A request's KV cache with its room reserved up front, which becomes stored blocks.

transformers' ``DynamicCache`` grows every layer by concatenation: each forward allocates each
layer anew and copies what it held (a 4K-token prefill run in 128-token chunks copies the cache
32 times), and the freed sizes rarely fit the next, larger ones. When the request is done,
cutting its KV into stored blocks copies it once more, so a finished node holds its KV twice
until its cache is dropped: 16 agents over one shared root held their private suffixes twice.

A :class:`RowCache` reserves one buffer, its *room*, ``[layers, 2, kv_heads, capacity,
head_dim]``, for the tokens the request will hold (the engine loop knows them: the prompt plus
what it will generate), writes each forward's keys and values into it in place, and hands each
layer out as a view. :meth:`RowCache.into_blocks` then copies the held tokens, a group of blocks
at a time (``_GROUP_BYTES``), into one buffer of exactly their size laid out as stored blocks
(each block ``[layers, 2, kv_heads, tokens, head_dim]``, contiguous, one after another), and
after each group hands the room's pages that held only copied tokens back to the OS
(``MADV_DONTNEED``). So the KV exists about once throughout, plus a group: a 4K-token root's
180 MiB (SmolLM2) no longer needs a second 180 MiB while it becomes blocks, and a request that
stopped before its reserved room was full keeps only what it held. The cache is spent.

```
room, as the forward writes it (layer-major):     blocks, after into_blocks (block-major):
L0 K [h0: t0 t1 ... tn .. cap] [h1: ...]          block 0: L0 K t0..t15, L0 V, L1 K, ... L29 V
L0 V [h0: ...]                                    block 1: L0 K t16..t31, ...
...                                               ...
L29 V [...]                                       last block (n mod 16 tokens)
each row's pages handed back as its tokens are copied
```
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from graphflow.kv.block import KVBlock, blocks_from_parts
from transport.memory import advise_huge_pages, give_back, give_back_pages

__all__ = ["RowCache"]

# NOTE: blocks copied between two hand-backs of the room's pages: the most a rewrite holds twice
_GROUP_BYTES = 8 << 20
# NOTE: blocks this large (a long context's, mapped on their own by malloc) get huge pages: they
# are the ones sent to other replicas, and same-host sends read the sender's pages one at a time
# (transport.memory). Smaller ones stay on 4 KiB pages, where a partly used last huge page would
# cost up to 2 MiB per request. The room itself stays on 4 KiB pages, which it hands back a few
# at a time.
_HUGE_BLOCKS_BYTES = 32 << 20


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
        self._room: torch.Tensor | None = torch.empty(shape, dtype=dtype, device=device)
        self._capacity = capacity
        super().__init__(config=config)
        self.layers = [_ReservedLayer(self._room[i, 0][None], self._room[i, 1][None]) for i in range(shape[0])]

    @property
    def capacity(self) -> int:
        return self._capacity

    @torch.inference_mode()
    def into_blocks(
        self,
        token_ids: Sequence[int],
        position_offset: int,
        parent_key: int,
        model_key: str,
        block_tokens: int,
    ) -> list[KVBlock]:
        """The held tokens as chained stored blocks in one buffer of their size, the room's
        pages handed back as they are copied (see the module doc); the cache is spent (any
        further use raises). ``token_ids`` are the tokens it holds, from ``position_offset``
        on, after the block ``parent_key``."""
        room = self._room
        if room is None:
            raise RuntimeError("this cache was turned into stored blocks; it holds nothing any more")
        held = self.get_seq_length()
        if len(token_ids) != held:
            raise ValueError(f"the cache holds {held} tokens but {len(token_ids)} token ids were given")
        if held == 0:
            raise ValueError("an empty cache has no blocks")
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be positive, got {block_tokens}")
        layers, _, heads, _, dim = room.shape
        per_token = layers * 2 * heads * dim
        out = torch.empty(held * per_token, dtype=room.dtype, device=room.device)
        if out.numel() * out.element_size() >= _HUGE_BLOCKS_BYTES:
            advise_huge_pages(out)  # NOTE: see _HUGE_BLOCKS_BYTES
        group = max(1, _GROUP_BYTES // (block_tokens * per_token * room.element_size())) * block_tokens
        parts: list[torch.Tensor] = []
        host = room.device.type == "cpu"  # NOTE: a device room is simply freed at the end
        for lo in range(0, held, group):
            hi = min(lo + group, held)
            full = (hi - lo) // block_tokens
            mid = lo + full * block_tokens  # NOTE: whole blocks up to mid, a shorter last one after
            if full:
                run = out[lo * per_token : mid * per_token].view(full, layers, 2, heads, block_tokens, dim)
                run.copy_(room[:, :, :, lo:mid].unflatten(3, (full, block_tokens)).permute(3, 0, 1, 2, 4, 5))
                parts.extend(run.unbind(0))
            if mid < hi:
                tail = out[mid * per_token : hi * per_token].view(layers, 2, heads, hi - mid, dim)
                parts.append(tail.copy_(room[:, :, :, mid:hi]))
            if hi < held and host:
                _hand_back_rows(room, lo, hi)
        if host:
            give_back(room)
        for layer in self.layers:
            assert isinstance(layer, _ReservedLayer)
            layer.spend()
        self._room = None
        return blocks_from_parts(parent_key, token_ids, position_offset, parts, model_key)


def _hand_back_rows(room: torch.Tensor, lo: int, hi: int) -> None:
    """Hand back the pages of ``room`` (``[layers, 2, kv_heads, capacity, head_dim]``) that hold
    only tokens before ``hi`` of one row, those before ``lo`` already handed back."""
    token_bytes = room.shape[4] * room.element_size()
    row_bytes = room.shape[3] * token_bytes
    page = mmap.PAGESIZE
    for row in range(room.shape[0] * room.shape[1] * room.shape[2]):
        start = room.data_ptr() + row * row_bytes
        # NOTE: from the page cut at lo (its tokens before lo went before, the rest are copied now),
        # never from before the row's start (that page holds the last tokens of the row before it);
        # give_back_pages rounds start up and spares the page cut at hi
        give_back_pages(max(start, (start + lo * token_bytes) // page * page), start + hi * token_bytes)
