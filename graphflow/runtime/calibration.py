"""Cost measurements on a replica's engine, the inputs of the scheduler's fits.

``prefill_samples`` → ``T_prefill``; ``resume_samples`` → ``T_resume`` (a cache rebuilt from
received blocks); ``reconstruct_samples`` → ``T_reconstruct`` (a template's KV from its base
and a residual); ``decode_samples`` → ``T_step`` (an engine-loop decode step of several rows over a
shared prefix). Served replicas run these at ``graphflow serve`` / ``connect()``;
``graphflow calibrate`` runs the same functions in one process and writes a profile.

Only ``prefill_samples`` and ``reconstruct_samples`` run the model to make what they time. The
blocks a resume rebuilds from and the shared prefix a decode step reads are
:func:`random_kv_blocks`: the model's layout, values drawn at random, because neither operation's
time depends on the values (copies and checksums; matrix products and a softmax over dense
fp32). A scratch A/B on this repo's 2-core host (SmolLM2-135M, one thread, 1,536 tokens, three
alternating rounds, medians): random over prefilled took 0.99× the time of a one-row decode
step, 1.00× of a 16-row one and 1.01× of a resume, and making the blocks took 0.45 s against the
prefill's 5.7 s — about 25 s of a four-replica ``connect()``, whose contention probe had every
replica prefill its own prefix at once.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial

import torch

from graphflow.kv.block import KVBlock
from graphflow.kv.differential.base import base_kv, template_kv
from graphflow.kv.differential.codecs import ResidualCodec, apply_residual, frame0_residual
from graphflow.kv.packing import blocks_to_cache, cache_from_tensor, cache_to_blocks
from graphflow.models.engine import Engine
from graphflow.models.gemm_padding import GemmPadding
from graphflow.models.prompts import prompt_token_ids
from graphflow.models.ragged import Row, SharedPrefix, forward_rows

__all__ = [
    "TEMPLATE_LENGTHS",
    "decode_samples",
    "median_seconds",
    "prefill_samples",
    "random_kv_blocks",
    "reconstruct_samples",
    "resume_samples",
]

TEMPLATE_LENGTHS = (16, 64, 256)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Call ``fn`` once untimed, then ``repeats`` times; the median wall-clock seconds."""
    if repeats <= 0:
        raise ValueError(f"repeats must be positive, got {repeats}")
    fn()
    return statistics.median(_timed(fn, repeats))


def _timed(fn: Callable[[], object], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def prefill_samples(engine: Engine, lengths: Sequence[int], repeats: int = 2) -> list[tuple[int, float]]:
    """``(tokens, seconds)`` of a prefill from scratch, the fastest of ``repeats``, after one
    warm-up prefill of the first length. A warm-up at every length would add a third prefill
    of the longest, the largest part of a calibration; a length's first run is 5-10% slower
    (its larger buffers are fresh pages), which the fastest of two leaves out."""
    if repeats <= 0:
        raise ValueError(f"repeats must be positive, got {repeats}")
    if lengths:
        engine.prefill(prompt_token_ids(engine.tokenizer, lengths[0]))
    return [(n, min(_timed(partial(engine.prefill, prompt_token_ids(engine.tokenizer, n)), repeats))) for n in lengths]


def random_kv_blocks(engine: Engine, n: int, block_tokens: int = 16, seed: int = 0) -> list[KVBlock]:
    """A chain of blocks for ``n`` prompt tokens laid out as ``engine``'s KV, in its dtype and on
    its device (as a prefill's blocks would be), with values drawn from a standard normal (seeded)
    instead of a prefill: for timing operations whose cost does not depend on the values (see
    the module docstring)."""
    if n < 1:
        raise ValueError(f"random KV blocks need at least one token, got {n}")
    ids = prompt_token_ids(engine.tokenizer, n)
    dtype = next(engine.model.parameters()).dtype
    kv = torch.randn(engine.identity.layout.block_shape(n), generator=torch.Generator().manual_seed(seed))
    cache = cache_from_tensor(kv.to(dtype), engine.config, engine.device)  # NOTE: where a prefill's would be
    return cache_to_blocks(cache, ids, engine.identity, block_tokens)


def resume_samples(
    engine: Engine, lengths: Sequence[int], block_tokens: int = 16, repeats: int = 2
) -> list[tuple[int, float]]:
    """``(bytes, seconds)`` to rebuild a cache from ``n`` tokens' blocks (checksums verified)."""
    out = []
    for n in lengths:
        blocks = random_kv_blocks(engine, n, block_tokens)
        rebuild = partial(blocks_to_cache, blocks, engine.identity, engine.config, engine.device)
        out.append((n * engine.kv_bytes_per_token(), median_seconds(rebuild, repeats)))
    return out


def reconstruct_samples(
    engine: Engine, lengths: Sequence[int] = TEMPLATE_LENGTHS, repeats: int = 3
) -> list[tuple[int, float]]:
    """``(residual bytes, seconds)`` to rebuild a template's KV from its base and a dense
    residual (``apply_residual``: add, re-rotate to the offset), per template length. The
    residual is a real one: the template run after a prefix as long as itself."""
    rope, codec, samples = engine.identity.rope, ResidualCodec(), []
    for n in lengths:
        text = prompt_token_ids(engine.tokenizer, 2 * n)
        prefix, ids = text[:n], text[n:]
        base = base_kv(engine, ids)
        enc = codec.encode(frame0_residual(template_kv(engine, ids, prefix), base, n, rope))
        samples.append((enc.nbytes, median_seconds(partial(apply_residual, base, enc, n, rope), repeats)))
    return samples


def decode_samples(
    engine: Engine,
    points: Sequence[tuple[int, int]],
    block_tokens: int = 16,
    steps: int = 3,
    padding: GemmPadding | None = None,
) -> list[tuple[int, int, float]]:
    """``(rows, context, seconds)`` of one decode step of ``rows`` requests continuing one shared
    ``context``-token prefix held in ``block_tokens``-token blocks (:func:`random_kv_blocks`),
    each row with a room of its own, through the ragged forward the engine loop runs (agents
    over one root decode this way), padded as the loop pads (``padding``, its measured plan);
    the median of ``steps`` steps after one untimed."""
    prefixes: dict[int, SharedPrefix] = {}
    out = []
    for rows, context in points:
        if rows < 1 or context < 1:
            raise ValueError(f"a decode sample needs at least one row and one context token, got {rows}, {context}")
        if context not in prefixes:  # NOTE: read from blocks, as a served root is: each step gathers it
            blocks = random_kv_blocks(engine, context, block_tokens)
            prefixes[context] = SharedPrefix([b.tensor for b in blocks], engine.device)
        batch = [Row([1], engine.new_cache(steps + 1), prefixes[context]) for _ in range(rows)]
        out.append((rows, context, median_seconds(partial(forward_rows, engine.model, batch, padding), steps)))
    return out
