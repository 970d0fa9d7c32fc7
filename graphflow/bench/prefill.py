"""Prefill benchmark: median prefill seconds per context length, and measured KV bytes per token."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from graphflow.kv.packing import cache_nbytes
from graphflow.models.engine import Engine
from graphflow.models.prompts import prompt_token_ids

__all__ = ["PrefillRow", "bench_prefill"]


@dataclass(frozen=True, slots=True)
class PrefillRow:
    tokens: int
    prefill_s_median: float
    prefill_s_min: float
    prefill_s_max: float
    repeats: int
    tokens_per_s: float
    kv_bytes_per_token: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def bench_prefill(
    engine: Engine,
    lengths: Sequence[int],
    repeats: int = 3,
    say: Callable[[str], None] = lambda _m: None,
) -> list[PrefillRow]:
    """For each length: one warm-up prefill, then ``repeats`` timed ones (fresh cache each).

    KV bytes per token are read off the real cache tensors after the prefill, not computed
    from the config.
    """
    if repeats <= 0 or not lengths or min(lengths) <= 0:
        raise ValueError(f"need positive lengths and repeats, got {list(lengths)}, {repeats}")
    rows = []
    for n in lengths:
        ids = prompt_token_ids(engine.tokenizer, n)
        say(f"prefill {n} tokens: warm-up")
        warm = engine.prefill(ids)
        kv_bytes = cache_nbytes(warm.cache)
        del warm
        times = []
        for r in range(repeats):
            say(f"prefill {n} tokens: run {r + 1}/{repeats}")
            times.append(engine.prefill(ids).seconds)
        med = statistics.median(times)
        rows.append(PrefillRow(n, med, min(times), max(times), repeats, n / med, kv_bytes / n))
    return rows
