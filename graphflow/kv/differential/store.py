"""Differential KV store: one base per operation, one shared residual per hot path.

``DifferentialKV`` holds, for one model, the base KV of each operation template and the
residual Δ₀ of each hot path key (learned from the first ``reference_executions`` exact
executions of that path, averaged). It answers "the template KV of ``v`` after path ``P`` at
offset ``o``" in one of three modes:

* ``exact`` — never approximate: ``None`` (recompute, or reuse an exact state);
* ``differential`` — ``rerotate(base + Δ₀, o)`` when the path is hot and learned, else ``None``
  (a cold path is pruned and recomputed);
* ``stateless`` — ``rerotate(base, o)`` for every path (no residuals at all).

A residual is tied to its model (``model_key``) and to the exact template tokens its base was
computed from (``base_version``); offering one computed for anything else raises
``IncompatibleState`` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from graphflow.kv.differential.codecs import EncodedResidual, ResidualCodec, apply_residual, frame0_residual
from graphflow.kv.differential.modes import KVMode, base_version
from graphflow.kv.differential.paths import PathKey
from graphflow.kv.errors import IncompatibleState
from graphflow.kv.state import RopeInfo

__all__ = ["Base", "DifferentialKV", "Residual"]


@dataclass(frozen=True, slots=True, eq=False)
class Base:
    op: str
    version: str
    kv: torch.Tensor  # the model's dtype, [L, 2, H, n, D]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


@dataclass(frozen=True, slots=True, eq=False)
class Residual:
    key: PathKey
    model_key: str
    base_version: str
    encoded: EncodedResidual
    executions: int  # exact executions averaged into it


class DifferentialKV:
    """Args: ``hot`` — the path keys residuals may be learned for (``None``: every path, i.e.
    no pruning); ``reference_executions`` — exact executions averaged into one residual."""

    def __init__(
        self,
        model_key: str,
        rope: RopeInfo,
        codec: ResidualCodec,
        hot: set[PathKey] | None = None,
        reference_executions: int = 1,
    ) -> None:
        if reference_executions < 1:
            raise ValueError(f"reference_executions must be at least 1, got {reference_executions}")
        self.model_key = model_key
        self.rope = rope
        self.codec = codec
        self.hot = hot
        self.reference_executions = reference_executions
        self.bases: dict[str, Base] = {}
        self.residuals: dict[PathKey, Residual] = {}
        self._pending: dict[PathKey, tuple[torch.Tensor, int]] = {}

    def add_base(self, op: str, template_ids: Sequence[int], kv: torch.Tensor) -> Base:
        base = Base(op, base_version(self.model_key, template_ids), kv)
        self.bases[op] = base
        self.residuals = {k: r for k, r in self.residuals.items() if k.op != op}  # old residuals are stale
        self._pending = {k: p for k, p in self._pending.items() if k.op != op}
        return base

    def wants(self, key: PathKey) -> bool:
        """Whether an exact execution of ``key`` would still be learned from."""
        return key.op in self.bases and key not in self.residuals and (self.hot is None or key in self.hot)

    def observe(self, key: PathKey, exact: torch.Tensor, offset: int) -> Residual | None:
        """Learn from one exact execution of ``key`` (its template KV at ``offset``); returns the
        residual once ``reference_executions`` have been averaged into it."""
        if not self.wants(key):
            return None
        delta = frame0_residual(exact, self.bases[key.op].kv, offset, self.rope)
        total, n = self._pending.get(key, (torch.zeros_like(delta), 0))
        total, n = total + delta, n + 1
        if n < self.reference_executions:
            self._pending[key] = (total, n)
            return None
        self._pending.pop(key, None)
        res = Residual(key, self.model_key, self.bases[key.op].version, self.codec.encode(total / n), n)
        self.residuals[key] = res
        return res

    def add_residual(self, res: Residual) -> None:
        """Take a residual learned elsewhere; refuses one for another model or base."""
        if res.model_key != self.model_key:
            raise IncompatibleState(
                f"the residual for {res.key} was computed with {res.model_key}, "
                f"not {self.model_key}; relearn it with this model"
            )
        base = self.bases.get(res.key.op)
        if base is None:
            raise IncompatibleState(f"no base for {res.key.op!r}; add the base before its residuals")
        if res.base_version != base.version:
            raise IncompatibleState(
                f"the residual for {res.key} was computed against another version of the "
                f"{res.key.op!r} template; relearn it from exact executions"
            )
        self.residuals[res.key] = res

    def template_kv(self, key: PathKey, offset: int, mode: KVMode) -> torch.Tensor | None:
        """The template KV of ``key.op`` at ``offset`` (float32), or ``None``: recompute it."""
        if mode is KVMode.EXACT or key.op not in self.bases:
            return None
        base = self.bases[key.op]
        if mode is KVMode.STATELESS:
            return apply_residual(base.kv, None, offset, self.rope)
        res = self.residuals.get(key)
        return None if res is None else apply_residual(base.kv, res.encoded, offset, self.rope)

    def nbytes(self) -> dict[str, int]:
        """Bytes held, by kind (real tensor sizes)."""
        return {
            "base": sum(b.nbytes for b in self.bases.values()),
            "residual": sum(r.encoded.nbytes for r in self.residuals.values()),
        }
