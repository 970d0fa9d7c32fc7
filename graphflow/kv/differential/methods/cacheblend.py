"""CacheBlend-style template KV: start from the re-rotated base, find the tokens whose KV
deviates most from the exact KV on an early layer, and recompute those through every layer.

Layer 0's keys and values depend only on each token and its position, so the prefix first
shows at layer 1 (``check_layer``): every template token is run through layers
``0..check_layer`` after the exact prefix (a partial prefill, a fraction
``(check_layer + 1) / layers`` of the full one), the per-token squared deviation of that layer's
K and V from the re-rotated base is ranked, and the top ``ratio`` of the template's tokens
(rounded down; ties to the earlier token) are recomputed with
:func:`graphflow.kv.differential.recompute.recompute_tokens`. CacheBlend itself narrows the
selection gradually over the first layers; one check layer is the simplest form of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from graphflow.kv.differential.codecs import fraction_of
from graphflow.kv.differential.methods import Rebuilt, moved_base
from graphflow.kv.differential.paths import PathKey
from graphflow.kv.differential.recompute import recompute_tokens
from graphflow.kv.differential.store import DifferentialKV
from graphflow.kv.packing import cache_from_tensor
from graphflow.kv.prefiller import Prefiller

__all__ = ["CacheBlend", "deviating_tokens", "early_layer_kv"]


@contextmanager
def _first_layers(model: Any, n: int) -> Iterator[None]:
    """The model runs only its first ``n`` decoder layers inside the block."""
    inner = model.model
    full = inner.layers
    inner.layers = torch.nn.ModuleList(list(full)[:n])
    try:
        yield
    finally:
        inner.layers = full


@torch.inference_mode()
def early_layer_kv(engine: Prefiller, prefix_kv: torch.Tensor, template: Sequence[int], layer: int) -> torch.Tensor:
    """Layer ``layer``'s exact ``[2, kv_heads, tokens, head_dim]`` KV of ``template`` after
    ``prefix_kv``, from running only layers ``0..layer``."""
    if not 0 <= layer < prefix_kv.shape[0]:
        raise ValueError(f"the check layer must lie in [0, {prefix_kv.shape[0]}), got {layer}")
    p = prefix_kv.shape[3]
    cache = cache_from_tensor(prefix_kv[: layer + 1], engine.config, prefix_kv.device)
    ids = torch.tensor([list(template)], dtype=torch.long, device=prefix_kv.device)
    with _first_layers(engine.model, layer + 1):
        engine.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    got: Any = cache.layers[layer]  # the later layers were never run, so they hold nothing
    return torch.stack((got.keys[0, :, p:], got.values[0, :, p:])).float()


def deviating_tokens(exact: torch.Tensor, approx: torch.Tensor, count: int) -> list[int]:
    """The ``count`` token positions whose ``[2, heads, tokens, dim]`` KV deviates most (squared
    error summed over K/V, heads and channels), ties to the earlier position, in order."""
    err = (exact.float() - approx.float()).pow(2).sum(dim=(0, 1, 3))
    order = torch.sort(err, descending=True, stable=True).indices
    return sorted(int(i) for i in order[:count])


@dataclass(frozen=True, slots=True)
class CacheBlend:
    store: DifferentialKV
    ratio: float
    check_layer: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.ratio <= 1:
            raise ValueError(f"CacheBlend's recompute ratio must lie in [0, 1], got {self.ratio}")

    @property
    def label(self) -> str:
        return f"cacheblend-{self.ratio:.0%}"

    def rebuild(
        self, engine: Prefiller, key: PathKey, prefix_kv: torch.Tensor, template: Sequence[int]
    ) -> Rebuilt | None:
        kv = moved_base(self.store, key, prefix_kv.shape[3])
        if kv is None:
            return None
        count = fraction_of(self.ratio, len(template))
        if count == 0:
            return Rebuilt(kv, 0)
        layer = min(self.check_layer, kv.shape[0] - 1)
        exact = early_layer_kv(engine, prefix_kv, template, layer)
        chosen = deviating_tokens(exact, kv[layer], count)
        return Rebuilt(recompute_tokens(engine, prefix_kv, kv, template, chosen), count)
