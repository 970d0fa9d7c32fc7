"""``graphflow calibrate``: measure prefill, cache rebuild and links; write a scheduler profile."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from graphflow.bench.timing import median_seconds
from graphflow.kv.packing import blocks_to_cache, cache_to_blocks
from graphflow.models.engine import Engine
from graphflow.models.prompts import prompt_token_ids
from graphflow.runtime.calibration import TEMPLATE_LENGTHS, reconstruct_samples
from scheduler.calibrate import Profile, fit_linear, fit_link, fit_prefill, save_profile
from transport.base import TransportConfig
from transport.local import LocalTransport
from transport.probe import probe_pair

__all__ = ["PREFILL_LENGTHS", "PROBE_TOKENS", "TEMPLATE_LENGTHS", "calibrate", "reconstruct_samples"]

PREFILL_LENGTHS = (96, 384, 1536, 3000)
PROBE_TOKENS = (48, 400, 1600, 5000)


def _local_link(sizes: Sequence[int], block_bytes: int, repeats: int) -> list[tuple[int, float]]:
    a, b = LocalTransport(TransportConfig(timeout_s=120)), LocalTransport(TransportConfig(timeout_s=120))
    try:
        sender = threading.Thread(target=probe_pair, args=(a, 0, b.address, sizes, block_bytes, repeats))
        sender.start()
        samples = probe_pair(b, 1, a.address, sizes, block_bytes, repeats)
        sender.join()
        return samples
    finally:
        a.close()
        b.close()


def calibrate(
    model: str, backends: Sequence[str], out: Path, repeats: int = 3, say: Callable[[str], None] = lambda _m: None
) -> Profile:
    engine = Engine.load(model, say=say)
    bpt, bt = engine.kv_bytes_per_token(), 16
    prefill, resume = [], []
    for n in PREFILL_LENGTHS:
        say(f"prefill {n} tokens")
        ids = prompt_token_ids(engine.tokenizer, n)
        prefill.append((n, median_seconds(partial(engine.prefill, ids), repeats)))
        blocks = cache_to_blocks(engine.prefill(ids).cache, ids, engine.identity, bt)
        resume.append(
            (n * bpt, median_seconds(partial(blocks_to_cache, blocks, engine.identity, engine.config), repeats))
        )
    sizes = [n * bpt for n in PROBE_TOKENS]
    links = {}
    for backend in backends:
        say(f"probing the {backend} link")
        if backend == "local":
            samples = _local_link(sizes, bpt * bt, repeats)
        elif backend in ("ucx", "mpi"):
            from graphflow.harness.launch import run_two_processes

            args = ["--job", "probe", "--sizes", ",".join(map(str, sizes)), "--block-bytes", str(bpt * bt),
                    "--repeats", str(repeats), "--timeout", "600"]  # fmt: skip
            samples = [(int(n), float(sec)) for n, sec in run_two_processes(backend, args, timeout_s=3600)[1]]
        else:
            raise ValueError(f"cannot probe backend {backend!r} here; use ucx, mpi or local")
        links[backend] = fit_link(samples, backend)
    say("timing template rebuilds (base + residual)")
    rebuild = fit_linear(reconstruct_samples(engine, repeats=repeats))
    profile = Profile(
        model, engine.identity.config_hash, bpt, fit_prefill(prefill, model), fit_linear(resume), links, rebuild
    )
    save_profile(out, profile)
    return profile
