"""Model engine: prefill from an optional cache, greedy decode, timings.

All forwards run under ``torch.inference_mode`` with batch size 1; the cache is a
transformers ``DynamicCache`` that forwards extend in place (so callers that want to keep a
cache intact pass :func:`clone_cache` of it).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from graphflow.kv.packing import cache_length
from graphflow.kv.state import ModelIdentity
from graphflow.models.linear_kernel import use_linear_kernel
from graphflow.models.loading import LoadedModel, load_model
from graphflow.models.registry import resolve
from graphflow.models.tokenizer import Tokenizer
from graphflow.runtime.batch_limits import check_linear_kernel

if TYPE_CHECKING:  # NOTE: transformers is imported where a cache is made, not by the client
    from transformers import DynamicCache, PretrainedConfig

__all__ = ["DecodeResult", "Engine", "PrefillResult", "clone_cache"]


@dataclass(frozen=True, slots=True, eq=False)
class PrefillResult:
    """``logits``: ``[vocab]`` at the last prefilled token; ``cache`` now holds all tokens."""

    logits: torch.Tensor
    cache: DynamicCache
    tokens: int
    seconds: float


@dataclass(frozen=True, slots=True, eq=False)
class DecodeResult:
    """``token_ids[i]`` is the argmax of ``logits[i]``, ``[steps, vocab]``."""

    token_ids: tuple[int, ...]
    logits: torch.Tensor
    step_seconds: tuple[float, ...]


def clone_cache(cache: DynamicCache) -> DynamicCache:
    """An independent copy of a cache (its tensors are copied)."""
    return copy.deepcopy(cache)


class Engine:
    """One model on one device, with the operations the runtime needs."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer: Tokenizer = loaded.tokenizer
        self.identity: ModelIdentity = loaded.identity
        self.device = loaded.device
        self.linear_kernel = "torch"  # what the model's linear layers run on (models.linear_kernel)

    @classmethod
    def load(
        cls,
        name: str,
        device: str = "cpu",
        dtype: str | None = None,
        say: Callable[[str], None] = lambda _m: None,
        linear_kernel: str = "auto",
    ) -> Engine:
        """Resolve a registry name or checkpoint folder and load it (``ValueError`` if unknown);
        ``linear_kernel``: what its linear layers run on
        (:func:`~graphflow.models.linear_kernel.use_linear_kernel`: ``torch``, ``onednn`` or
        ``auto``, measured here on the calling thread)."""
        check_linear_kernel(linear_kernel)  # NOTE: before the model loads, not after
        engine = cls(load_model(resolve(name), device=device, dtype=dtype, say=say))
        engine.linear_kernel = use_linear_kernel(engine.model, linear_kernel)
        return engine

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    def new_cache(self, capacity: int | None = None) -> DynamicCache:
        """An empty cache; with ``capacity``, a :class:`~graphflow.models.row_cache.RowCache`
        with room for that many tokens reserved (full-attention models only)."""
        from transformers import DynamicCache

        from graphflow.models.row_cache import RowCache

        if capacity is None:
            return DynamicCache(config=self.model.config)
        dtype = next(self.model.parameters()).dtype
        return RowCache(self.model.config, capacity, dtype, self.device)

    def kv_bytes_per_token(self) -> int:
        itemsize = torch.empty(0, dtype=next(self.model.parameters()).dtype).element_size()
        return self.identity.layout.bytes_per_token(itemsize)

    @torch.inference_mode()
    def prefill(self, token_ids: Sequence[int], cache: DynamicCache | None = None) -> PrefillResult:
        """Run ``token_ids`` after whatever ``cache`` holds (mutating it); time the forward."""
        if not token_ids:
            raise ValueError("prefill needs at least one token")
        cache = cache if cache is not None else self.new_cache()
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        start = time.perf_counter()
        out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[0, -1].float()
        self._sync()
        seconds = time.perf_counter() - start
        return PrefillResult(logits=logits, cache=out.cache, tokens=len(token_ids), seconds=seconds)

    @torch.inference_mode()
    def decode_greedy(
        self, cache: DynamicCache, first_token: int, steps: int, stop_token: int | None = None
    ) -> DecodeResult:
        """Feed ``first_token`` and then each argmax, ``steps`` times, extending ``cache``.

        Returns the ``steps`` tokens produced after ``first_token`` and their logits.
        """
        if steps <= 0:
            raise ValueError(f"steps must be positive, got {steps}")
        token = int(first_token)
        out_tokens: list[int] = []
        out_logits: list[torch.Tensor] = []
        times: list[float] = []
        for _ in range(steps):
            ids = torch.tensor([[token]], dtype=torch.long, device=self.device)
            start = time.perf_counter()
            out = self.model(input_ids=ids, cache=cache, use_cache=True)
            logits = out.logits[0, -1].float()
            token = int(torch.argmax(logits))
            self._sync()
            times.append(time.perf_counter() - start)
            out_tokens.append(token)
            out_logits.append(logits)
            if stop_token is not None and token == stop_token:
                break
        return DecodeResult(tuple(out_tokens), torch.stack(out_logits).cpu(), tuple(times))

    @torch.inference_mode()
    def forward_rows(self, rows: Sequence[Sequence[int]], cache: DynamicCache) -> list[int]:
        """Run equal-length token rows after a batch cache with one row per branch (mutating it);
        returns each row's greedy next token."""
        if not rows or len({len(r) for r in rows}) != 1 or not rows[0]:
            raise ValueError("forward_rows needs one or more non-empty rows of equal length")
        ids = torch.tensor([list(r) for r in rows], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        self._sync()
        return [int(t) for t in torch.argmax(out.logits[:, -1], dim=-1)]

    @torch.inference_mode()
    def decode_rows(self, cache: DynamicCache, first_tokens: Sequence[int], steps: int) -> list[list[int]]:
        """Batched greedy decode: feed each row's ``first_tokens`` entry, then its argmax,
        ``steps`` times; returns the ``steps`` tokens each row produced after its first."""
        if steps < 0:
            raise ValueError(f"steps must be non-negative, got {steps}")
        tokens = torch.tensor([[int(t)] for t in first_tokens], dtype=torch.long, device=self.device)
        produced: list[torch.Tensor] = []
        for _ in range(steps):
            out = self.model(input_ids=tokens, cache=cache, use_cache=True)
            tokens = torch.argmax(out.logits[:, -1], dim=-1, keepdim=True)
            produced.append(tokens)
        self._sync()
        if not produced:
            return [[] for _ in first_tokens]
        return [[int(t) for t in row] for row in torch.cat(produced, dim=1).cpu()]

    @torch.inference_mode()
    def full_logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits ``[len(token_ids), vocab]`` of one forward with no cache (full recompute)."""
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        return self.model(input_ids=ids, use_cache=False).logits[0].float().cpu()

    def cached_tokens(self, cache: DynamicCache) -> int:
        return cache_length(cache)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __repr__(self) -> str:
        return f"Engine({self.identity.model_id}, device={self.device}, config_hash={self.identity.config_hash})"
