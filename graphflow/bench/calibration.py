"""``graphflow calibrate``: measure prefill, cache rebuild and links; write a scheduler profile."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from graphflow.models.engine import Engine
from graphflow.runtime.calibration import TEMPLATE_LENGTHS, prefill_samples, reconstruct_samples, resume_samples
from scheduler.calibrate import Profile, fit_linear, fit_link, fit_prefill, save_profile
from transport.base import TransportConfig
from transport.local import LocalTransport
from transport.probe import probe_pair

__all__ = ["PREFILL_LENGTHS", "PROBED_BACKENDS", "PROBE_TOKENS", "TEMPLATE_LENGTHS", "calibrate", "reconstruct_samples"]

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


PROBED_BACKENDS = ("ucx", "mpi", "local")  # NOTE: the links `calibrate` can measure between two processes here


def calibrate(
    model: str, backends: Sequence[str], out: Path, repeats: int = 3, say: Callable[[str], None] = lambda _m: None
) -> Profile:
    unknown = [b for b in backends if b not in PROBED_BACKENDS]
    if unknown:  # NOTE: before the model loads and the prefill timings run (minutes on a real model)
        raise ValueError(f"cannot probe backend {unknown[0]!r} here; use {', '.join(PROBED_BACKENDS)}")
    engine = Engine.load(model, say=say)
    bpt, bt = engine.kv_bytes_per_token(), 16
    say(f"prefill and cache rebuild at {', '.join(map(str, PREFILL_LENGTHS))} tokens")
    prefill = prefill_samples(engine, PREFILL_LENGTHS, repeats)
    resume = resume_samples(engine, PREFILL_LENGTHS, bt, repeats)
    sizes = [n * bpt for n in PROBE_TOKENS]
    links = {}
    for backend in backends:
        say(f"probing the {backend} link")
        if backend == "local":
            samples = _local_link(sizes, bpt * bt, repeats)
        elif backend in ("ucx", "mpi"):
            from graphflow.harness.launch import run_two_processes

            args = [
                "--job",
                "probe",
                "--sizes",
                ",".join(map(str, sizes)),
                "--block-bytes",
                str(bpt * bt),
                "--repeats",
                str(repeats),
                "--timeout",
                "600",
            ]
            samples = [(int(n), float(sec)) for n, sec in run_two_processes(backend, args, timeout_s=3600)[1]]
        else:
            raise RuntimeError(f"backend {backend!r} passed the check above but has no probe")
        links[backend] = fit_link(samples, backend)
    say("timing template rebuilds (base + residual)")
    rebuild = fit_linear(reconstruct_samples(engine, repeats=repeats))
    profile = Profile(
        model, engine.identity.config_hash, bpt, fit_prefill(prefill, model), fit_linear(resume), links, rebuild
    )
    save_profile(out, profile)
    return profile
