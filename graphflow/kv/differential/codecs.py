"""Differential KV's residual codecs: how the difference between an exact template KV and its
re-rotated base is stored.

* Stored sparse: keep entries with ``|Δ| > ε`` (or the top-energy fraction); its size counts
  indices and values. ``KV(P, v) ≈ rerotate(base(v), |P|) + ΔKV(P, v)``.

A residual shared by every execution of one prefix path is stored in the *position-0 frame*,
``Δ₀ = rerotate(KV_exact, −|P|) − base(v)``, so it applies at any offset:
``KV(P, v) ≈ rerotate(base(v) + Δ₀, |P|)``. ``ResidualCodec`` stores Δ₀ dense (float16) or
sparse per row (the largest ``keep_per_row`` channels of each (layer, K/V, head, token) row,
uint8 channel indices + float16 values), optionally with the first ``sink_tokens`` template
tokens dense: the base is computed with no prefix, so its first tokens act as an attention
sink and carry most of the residual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from graphflow.kv.differential.base import rerotate_kv
from graphflow.kv.state import RopeInfo

__all__ = [
    "EncodedResidual",
    "fraction_of",
    "ResidualCodec",
    "SparseResidual",
    "apply_residual",
    "frame0_residual",
    "near_zero_fractions",
    "reconstruct",
    "sparsify",
]


def fraction_of(fraction: float, n: int) -> int:
    """``fraction`` of ``n`` tokens, rounded down (a recompute of "15%" never exceeds 15%)."""
    return min(n, math.floor(fraction * n + 1e-9))


@dataclass(frozen=True, slots=True, eq=False)
class SparseResidual:
    shape: tuple[int, ...]
    indices: torch.Tensor  # int32 flat indices
    values: torch.Tensor  # float16 values

    @property
    def nbytes(self) -> int:
        """Real bytes held: indices plus values."""
        return self.indices.numel() * self.indices.element_size() + self.values.numel() * self.values.element_size()

    def dense(self) -> torch.Tensor:
        out = torch.zeros(int(torch.tensor(self.shape).prod()), dtype=torch.float32)
        out[self.indices.long()] = self.values.float()
        return out.reshape(self.shape)


def sparsify(delta: torch.Tensor, eps: float | None = None, keep_fraction: float | None = None) -> SparseResidual:
    """Keep entries with ``|Δ| > eps``, or the largest ``keep_fraction`` of them by magnitude."""
    if (eps is None) == (keep_fraction is None):
        raise ValueError("give exactly one of eps or keep_fraction")
    flat = delta.reshape(-1)
    if eps is not None:
        idx = torch.nonzero(flat.abs() > eps).squeeze(1)
    else:
        assert keep_fraction is not None
        if not 0 <= keep_fraction <= 1:
            raise ValueError(f"keep_fraction must lie in [0, 1], got {keep_fraction}")
        k = int(round(keep_fraction * flat.numel()))
        idx = torch.topk(flat.abs(), k).indices if k else torch.zeros(0, dtype=torch.long)
    return SparseResidual(tuple(delta.shape), idx.to(torch.int32), flat[idx].to(torch.float16))


def reconstruct(base: torch.Tensor, delta: SparseResidual | None, offset: int, rope: RopeInfo) -> torch.Tensor:
    """``rerotate(base, offset) + Δ`` (stateless when ``delta`` is None)."""
    moved = rerotate_kv(base, offset, rope)
    return moved if delta is None else moved + delta.dense()


def near_zero_fractions(
    delta: torch.Tensor, reference: torch.Tensor, eps_rel: float
) -> tuple[list[float], list[float]]:
    """Per layer, the fraction of K and of V residual entries with ``|Δ| ≤ eps_rel · mean|ref|``
    (mean over that layer's K, resp. V, of the exact KV)."""
    k_frac: list[float] = []
    v_frac: list[float] = []
    for layer in range(delta.shape[0]):
        for which, acc in ((0, k_frac), (1, v_frac)):
            thr = eps_rel * reference[layer, which].abs().mean()
            acc.append(float((delta[layer, which].abs() <= thr).float().mean()))
    return k_frac, v_frac


def frame0_residual(exact: torch.Tensor, base: torch.Tensor, offset: int, rope: RopeInfo) -> torch.Tensor:
    """Δ₀ = rerotate(exact, −offset) − base: the residual moved back to positions ``[0, n)``."""
    if exact.shape != base.shape:
        raise ValueError(f"exact {tuple(exact.shape)} and base {tuple(base.shape)} KV differ in shape")
    return rerotate_kv(exact.float(), -offset, rope) - base.float()


@dataclass(frozen=True, slots=True, eq=False)
class EncodedResidual:
    """Δ₀ as stored: nothing for the first ``head`` tokens (recomputed, not rebuilt), ``sink``
    (dense) for the next ones, and the rest dense or per-row sparse."""

    shape: tuple[int, ...]
    sink: torch.Tensor  # float16 [L, 2, H, s, D]
    values: torch.Tensor  # float16 [L, 2, H, T - head - s, m]  (m = D when dense)
    indices: torch.Tensor | None  # uint8/int16 [L, 2, H, T - head - s, m], None when dense
    head: int = 0

    @property
    def nbytes(self) -> int:
        """Real bytes held by the stored tensors."""
        parts = [self.sink, self.values] + ([self.indices] if self.indices is not None else [])
        return sum(t.numel() * t.element_size() for t in parts)

    def dense(self) -> torch.Tensor:
        rest = self.values.float()
        if self.indices is not None:
            full = torch.zeros((*self.values.shape[:-1], self.shape[-1]), dtype=torch.float32)
            rest = full.scatter_(-1, self.indices.long(), rest)
        head = torch.zeros((*self.shape[:3], self.head, self.shape[-1]), dtype=torch.float32)
        return torch.cat((head, self.sink.float(), rest), dim=3)


@dataclass(frozen=True, slots=True)
class ResidualCodec:
    """How a residual is stored: ``keep_per_row=None`` keeps it dense (float16);
    ``sink_tokens`` first tokens stay dense when the rest is sparse; ``recompute_head`` first
    tokens are not stored at all — whoever rebuilds the template recomputes them after the
    prefix (:func:`graphflow.kv.differential.recompute.recompute_tokens`); ``recompute_fraction``
    raises that head to a fraction of each template's tokens (rounded down) where it is larger."""

    keep_per_row: int | None = None
    sink_tokens: int = 0
    recompute_head: int = 0
    recompute_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.keep_per_row is not None and self.keep_per_row < 1:
            raise ValueError(f"keep_per_row must be at least 1 (or None for dense), got {self.keep_per_row}")
        if self.sink_tokens < 0:
            raise ValueError(f"sink_tokens must be non-negative, got {self.sink_tokens}")
        if self.recompute_head < 0:
            raise ValueError(f"recompute_head must be non-negative, got {self.recompute_head}")
        if not 0 <= self.recompute_fraction <= 1:
            raise ValueError(f"recompute_fraction must lie in [0, 1], got {self.recompute_fraction}")

    def head_tokens(self, n: int) -> int:
        """How many of an ``n``-token template's first tokens are recomputed, not rebuilt."""
        return min(n, max(self.recompute_head, fraction_of(self.recompute_fraction, n)))

    @property
    def label(self) -> str:
        rows = "dense" if self.keep_per_row is None else f"top{self.keep_per_row}/row"
        rows = f"{rows}+sink{self.sink_tokens}" if self.sink_tokens else rows
        if self.recompute_fraction:
            return f"{rows}, first {self.recompute_fraction:.0%} recomputed"
        return f"{rows}, first {self.recompute_head} recomputed" if self.recompute_head else rows

    def encode(self, delta: torch.Tensor) -> EncodedResidual:
        if delta.dim() != 5:
            raise ValueError(f"a residual is [layers, 2, heads, tokens, head_dim], got shape {tuple(delta.shape)}")
        h = self.head_tokens(delta.shape[3])
        s = min(self.sink_tokens, delta.shape[3] - h)
        sink, rest = delta[:, :, :, h : h + s].half(), delta[:, :, :, h + s :]
        head_dim = delta.shape[-1]
        if self.keep_per_row is None or self.keep_per_row >= head_dim:
            return EncodedResidual(tuple(delta.shape), sink, rest.half(), None, h)
        idx = torch.topk(rest.abs(), self.keep_per_row, dim=-1).indices
        vals = torch.gather(rest, -1, idx).half()
        idx_dtype = torch.uint8 if head_dim <= 256 else torch.int16
        return EncodedResidual(tuple(delta.shape), sink, vals, idx.to(idx_dtype), h)


def apply_residual(base: torch.Tensor, delta: EncodedResidual | None, offset: int, rope: RopeInfo) -> torch.Tensor:
    """``rerotate(base + Δ₀, offset)`` (float32); stateless (base only) when ``delta`` is None."""
    kv = base.float() if delta is None else base.float() + delta.dense()
    return rerotate_kv(kv, offset, rope)
