from __future__ import annotations

import torch

from graphflow.kv.state import KVLayout, ModelIdentity, RopeInfo

IDENTITY = ModelIdentity("toy", "cafe", RopeInfo(10000.0), KVLayout(layers=2, kv_heads=2, head_dim=4, dtype="float32"))


def kv(tokens: int, seed: int = 0) -> torch.Tensor:
    """A deterministic [layers, 2, kv_heads, tokens, head_dim] tensor for IDENTITY."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(IDENTITY.layout.block_shape(tokens), generator=g)
