"""What KV code needs of a model engine: a small protocol, so ``kv`` never imports the engine
(``graphflow.models.engine.Engine`` satisfies it; tests may pass anything that does)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from graphflow.kv.state import ModelIdentity

__all__ = ["Prefilled", "Prefiller"]


class Prefilled(Protocol):
    """A prefill's result: the grown cache and the last position's logits."""

    @property
    def cache(self) -> Any: ...
    @property
    def logits(self) -> torch.Tensor: ...


class Prefiller(Protocol):
    """A model that prefills tokens onto a cache (``config`` and ``model`` are the transformers
    config and module, ``identity`` the model's KV identity)."""

    @property
    def identity(self) -> ModelIdentity: ...
    @property
    def config(self) -> Any: ...
    @property
    def model(self) -> Any: ...
    @property
    def device(self) -> torch.device: ...

    def prefill(self, token_ids: Sequence[int], cache: Any = None) -> Prefilled: ...
