"""A request's KV cache with its room reserved up front, which becomes stored blocks.

transformers' ``DynamicCache`` grows every layer by concatenation: each forward allocates each
layer anew and copies what it held (a 4K-token prefill run in 128-token chunks copies the cache
32 times), and the freed sizes rarely fit the next, larger ones. When the request is done,
cutting its KV into stored blocks copies it once more, so a finished node holds its KV twice
until its cache is dropped: 16 agents over one shared root held their private suffixes twice.

A :class:`RowCache` reserves one buffer, its *room*, ``[layers, 2, kv_heads, capacity,
head_dim]``, for the tokens the request will hold (the engine loop knows them: the prompt plus
what it will generate), writes each forward's keys and values into it in place, and hands each
layer out as a view. :meth:`RowCache.into_blocks` then copies the held tokens into one buffer of
exactly their size laid out as stored blocks (each block ``[layers, 2, kv_heads, tokens,
head_dim]``, contiguous, one after another), handing the room's pages that held only copied
tokens back to the OS as it goes (``MADV_DONTNEED``):

* **one layer at a time** for host KV under ``_HUGE_BLOCKS_BYTES`` (a short node's): the room is
  layer-major, so the layers copied are one range of pages, handed back in one call per layer;
* **a group of whole blocks at a time** (``_GROUP_BYTES``) for larger KV, whose blocks get huge
  pages: copying a layer writes a slice of every block, which would fault in every huge page
  of the blocks at the first layer (and for a device's, which hands nothing back).

So the KV exists about once throughout, plus a layer or a group: a 4K-token root's 180 MiB
(SmolLM2) no longer needs a second 180 MiB while it becomes blocks, and a request that stopped
before its reserved room was full keeps only what it held. The cache is spent.

```
room, as the forward writes it (layer-major):     blocks, after into_blocks (block-major):
L0 K [h0: t0 t1 ... tn .. cap] [h1: ...]          block 0: L0 K t0..t15, L0 V, L1 K, ... L29 V
L0 V [h0: ...]                                    block 1: L0 K t16..t31, ...
...                                               ...
L29 V [...]                                       last block (n mod 16 tokens)
the room's pages handed back as they are copied (a layer, or a group of blocks, at a time)
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

# NOTE: blocks copied between two hand-backs of the room's pages, for KV of _HUGE_BLOCKS_BYTES and
# more: the most such a rewrite holds twice. Smaller KV goes a layer at a time: as one group (all
# of a short node's KV fits in one), an agent of 89 SmolLM2 tokens (3.9 MiB) was held twice to the
# end of its copy, and two agents finishing in one step added 7.7 MiB to the holder's peak in a
# 16-agent shared-root trial of `graphflow bench serve`; a layer at a time, 0.1-0.4 MiB (four trials).
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
        # NOTE: from malloc's heap, like the step's other buffers. A room mapped on its own (as the
        # arena's slabs are), so that a freed room leaves no hole in the heap, measured no
        # different in the 16-agent shared-root trial (holder's peak growth 94-125 MiB on the heap,
        # 110-125 mapped, six scratch trials each, alternating)
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
        host = room.device.type == "cpu"  # NOTE: a device room is simply freed at the end
        out = torch.empty(held * _token_numel(room), dtype=room.dtype, device=room.device)
        huge = out.numel() * out.element_size() >= _HUGE_BLOCKS_BYTES
        if huge:
            advise_huge_pages(out)  # NOTE: see _HUGE_BLOCKS_BYTES
        if host and not huge:
            parts = _copy_by_layers(room, out, held, block_tokens)
        else:  # NOTE: a device room hands nothing back, so one group is one copy, not one per layer
            parts = _copy_by_block_groups(room, out, held, block_tokens, host)
        if host:
            give_back(room)
        for layer in self.layers:
            assert isinstance(layer, _ReservedLayer)
            layer.spend()
        self._room = None
        return blocks_from_parts(parent_key, token_ids, position_offset, parts, model_key)


def _token_numel(room: torch.Tensor) -> int:
    layers, _, heads, _, dim = room.shape
    return int(layers * 2 * heads * dim)


def _blocks_in(
    out: torch.Tensor, room: torch.Tensor, lo: int, hi: int, block_tokens: int
) -> tuple[torch.Tensor | None, torch.Tensor | None, int]:
    """The views of ``out`` that hold tokens ``lo``..``hi`` as blocks: the whole ones
    ``[n, layers, 2, kv_heads, block_tokens, head_dim]`` up to the token returned, and the
    shorter last one after it (``None`` where there is none)."""
    layers, _, heads, _, dim = room.shape
    per_token = _token_numel(room)
    full = (hi - lo) // block_tokens
    mid = lo + full * block_tokens
    run = out[lo * per_token : mid * per_token].view(full, layers, 2, heads, block_tokens, dim) if full else None
    tail = out[mid * per_token : hi * per_token].view(layers, 2, heads, hi - mid, dim) if mid < hi else None
    return run, tail, mid


def _copy_by_layers(room: torch.Tensor, out: torch.Tensor, held: int, block_tokens: int) -> list[torch.Tensor]:
    """Copy the room into ``out``'s blocks one layer at a time, handing back the room's pages up
    to the layer copied (one range: the room is layer-major); returns the blocks."""
    run, tail, mid = _blocks_in(out, room, 0, held, block_tokens)
    layers = room.shape[0]
    base, layer_bytes = room.data_ptr(), room[0].numel() * room.element_size()
    for layer in range(layers):
        if run is not None:
            run[:, layer].copy_(room[layer, :, :, :mid].unflatten(2, (-1, block_tokens)).permute(2, 0, 1, 3, 4))
        if tail is not None:
            tail[layer].copy_(room[layer, :, :, mid:held])
        if layer + 1 < layers:  # NOTE: the last layer's pages go with the whole room
            _give_back_copied(base, layer * layer_bytes, (layer + 1) * layer_bytes)
    return [*(run.unbind(0) if run is not None else ()), *((tail,) if tail is not None else ())]


def _copy_by_block_groups(
    room: torch.Tensor, out: torch.Tensor, held: int, block_tokens: int, host: bool
) -> list[torch.Tensor]:
    """Copy the room into ``out``'s blocks a group of whole blocks at a time (``_GROUP_BYTES``),
    handing back the room's pages of the tokens copied after each group; returns the blocks."""
    group_blocks = _GROUP_BYTES // (block_tokens * _token_numel(room) * room.element_size())
    group = max(1, group_blocks) * block_tokens
    parts: list[torch.Tensor] = []
    for lo in range(0, held, group):
        hi = min(lo + group, held)
        run, tail, mid = _blocks_in(out, room, lo, hi, block_tokens)
        if run is not None:
            run.copy_(room[:, :, :, lo:mid].unflatten(3, (-1, block_tokens)).permute(3, 0, 1, 2, 4, 5))
            parts.extend(run.unbind(0))
        if tail is not None:
            parts.append(tail.copy_(room[:, :, :, mid:hi]))
        if hi < held and host:
            _hand_back_rows(room, lo, hi)
    return parts


def _hand_back_rows(room: torch.Tensor, lo: int, hi: int) -> None:
    """Hand back the pages of ``room`` (``[layers, 2, kv_heads, capacity, head_dim]``) that hold
    only tokens before ``hi`` of one row, those before ``lo`` already handed back."""
    token_bytes = room.shape[4] * room.element_size()
    row_bytes = room.shape[3] * token_bytes
    for row in range(room.shape[0] * room.shape[1] * room.shape[2]):
        _give_back_copied(room.data_ptr() + row * row_bytes, lo * token_bytes, hi * token_bytes)


def _give_back_copied(base: int, lo: int, hi: int) -> None:
    """Hand back the pages of the span at ``base`` whose bytes are all copied once its bytes
    ``lo``..``hi`` are (those before ``lo`` were copied, and their whole pages handed back,
    before): from the page cut at ``lo``, never from before ``base`` (that page holds bytes of
    what lies before the span), to the page cut at ``hi``, which give_back_pages spares (it
    holds bytes still to be copied)."""
    give_back_pages(max(base, (base + lo) // mmap.PAGESIZE * mmap.PAGESIZE), base + hi)
