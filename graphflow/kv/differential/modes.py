"""The run modes of a replica's template KV, what it reports, and base versions, without torch
(deployments, replica stats and the executor's plans cross into processes that never load it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import xxhash

__all__ = ["KVMode", "TemplateStats", "base_version", "kv_mode"]


class KVMode(StrEnum):
    EXACT = "exact"
    DIFFERENTIAL = "differential"
    STATELESS = "stateless"


def kv_mode(name: str) -> KVMode:
    """The run mode called ``name``, or a ``ValueError`` that lists the modes."""
    try:
        return KVMode(name)
    except ValueError:
        raise ValueError(f"unknown KV mode {name!r}; use one of {', '.join(m.value for m in KVMode)}") from None


def base_version(model_key: str, template_ids: Sequence[int]) -> str:
    """Identifies a base: the model and the exact template tokens it was computed from."""
    h = xxhash.xxh64(model_key.encode())
    h.update(np.asarray(list(template_ids), dtype=np.int64).tobytes())
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class TemplateStats:
    """What a replica's template KV did and holds (all zero in exact mode)."""

    kv_mode: str = KVMode.EXACT.value
    templates_rebuilt: int = 0
    executions_learned: int = 0
    residuals: int = 0
    hot_paths: int = 0
    differential_base_bytes: int = 0
    differential_residual_bytes: int = 0
