"""Rotary position embedding (RoPE) re-rotation of cached keys.

RoPE rotates each pair of key channels ``(i, i + d/2)`` by angle ``p · θ^(−2i/d)`` at position
``p`` (the "rotate-half" layout of Llama/Qwen2 in transformers). Rotations compose, so a key
cached at position ``p`` becomes the key at ``p + Δ`` by one more rotation by ``Δ``:

    K(p + Δ) = K(p) · cos(Δω) + rotate_half(K(p)) · sin(Δω)

Exact in real arithmetic; in floating point it differs from a direct computation at ``p + Δ``
by rounding only. Values are not rotated. Only the default RoPE (no scaling) is supported.
"""

from __future__ import annotations

import json

import torch

from graphflow.kv.state import RopeInfo

__all__ = ["inv_freq", "rerotate_keys", "rotate_half"]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def inv_freq(rope: RopeInfo, head_dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``θ^(−2i/d)`` for ``i < d/2`` (float64); refuses scaled RoPE variants."""
    scaling = rope.scaling if rope.scaling.startswith("{") else json.dumps({"rope_type": rope.scaling})
    kind = json.loads(scaling).get("rope_type", "default")
    if kind != "default":
        raise ValueError(f"re-rotation supports default RoPE only, this model uses {kind!r}; recompute instead")
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    return 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim))


def rerotate_keys(keys: torch.Tensor, delta: int, rope: RopeInfo) -> torch.Tensor:
    """Keys ``[..., tokens, head_dim]`` cached at positions ``p`` → the same keys at ``p + delta``.

    Computed in float64 and cast back to the keys' dtype.
    """
    if delta == 0:
        return keys.clone()
    freqs = float(delta) * inv_freq(rope, keys.shape[-1], keys.device)
    angle = torch.cat((freqs, freqs))
    k = keys.double()
    return (k * angle.cos() + rotate_half(k) * angle.sin()).to(keys.dtype)
