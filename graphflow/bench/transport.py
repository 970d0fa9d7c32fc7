"""``graphflow bench transport``: ours vs the raw reference of each backend, in the same run.

* ``ucx``, ``mpi`` — two processes (``graphflow.harness.pair``); see ``transport_pair``. Their
  rows also carry ``bare_s`` (``bare_gbps``, ``bare_ratio``, ``ours_over_bare``): the same
  bytes as plain messages cut as the wire cuts them, hashed by the receiver as they land (no
  protocol) — the ceiling for ours.
* ``local`` — one process: ours is a LocalTransport pair, send and receive (into pooled
  tensors) awaited together on the endpoints' loop, as an async caller does; raw is one
  ``numpy.copyto`` of the same bytes.
* ``ray`` — two Ray worker processes; the driver times each iteration: raw is ``ray.put`` of
  one numpy array in worker A then ``ray.get`` in worker B; ours is a RayTransport send in A
  and receive in B, run concurrently.
Every number is the median of ``repeats × iters`` individually timed transfers after warm-up
(the two-process backends time ``iters`` back-to-back transfers per measurement instead).

``peers`` (``nixl``, ``mooncake``; ``graphflow.bench.peers``) run after the backends, same plan,
between two processes of their own; the ucx rows gain ``peer_gbps`` and ``ours_over_peer``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphflow.bench.transport_pair import BenchPlan, blocks_for
from graphflow.bench.transport_rows import PeerResult, TransportRow, with_peers
from transport.base import TransferSpec, TransportConfig
from transport.local import LocalTransport
from transport.pool import TensorPool
from transport.registry import check_backend

__all__ = ["bench_transport", "parse_size"]

_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "gb": 10**9}


def parse_size(text: str) -> int:
    """``"16MiB"`` → 16777216; plain integers are bytes. A size under one byte is refused."""
    t = text.strip().lower()
    size = None
    for unit in sorted(_UNITS, key=len, reverse=True):
        if t.endswith(unit) and t[: -len(unit)].strip().replace(".", "", 1).isdigit():
            size = int(float(t[: -len(unit)]) * _UNITS[unit])
            break
    if size is None and t.isdigit():
        size = int(t)
    if size is None:
        raise ValueError(f"cannot read size {text!r}; use bytes or a unit like 1MiB, 64MiB, 1GiB")
    if size < 1:
        raise ValueError(f"size {text!r} is under one byte; give sizes of at least 1 byte, e.g. 1MiB")
    return size


def _timed(plan: BenchPlan, step: Callable[[], None]) -> list[float]:
    """The seconds of each of ``repeats × iters`` timed runs of ``step``, after warm-up.

    Each step is timed on its own (a step here is one whole transfer, ≥ 1 MiB), so a few slow
    transfers (through the Ray object store some took 0.1–1.2 s where the same transfer usually
    takes 45 ms; mostly fresh object-store memory, see transport/README.md) move the median of
    ours and of raw alike, not every repeat they fall in."""
    for _ in range(plan.warmup):
        step()
    times = []
    for _ in range(plan.repeats * plan.iters):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def _timed_row(
    backend: str, size: int, blocks: int, block_bytes: int, ours: list[float], raw: list[float]
) -> TransportRow:
    """The row, plus every transfer's milliseconds (outliers show there, not in the medians)."""
    return TransportRow(
        backend,
        size,
        blocks,
        block_bytes,
        statistics.median(ours),
        statistics.median(raw),
        ours_ms=tuple(round(t * 1e3, 2) for t in ours),
        raw_ms=tuple(round(t * 1e3, 2) for t in raw),
    )


def _bench_local(plan: BenchPlan) -> list[TransportRow]:
    rows = []
    config = TransportConfig(timeout_s=60)
    a, b = LocalTransport(config), LocalTransport(config)
    pool = TensorPool(max_free_bytes=4 << 30)
    ids = iter(range(1, 1 << 30))
    try:
        for size in plan.sizes:
            src, dst = np.ones(size, np.uint8), np.zeros(size, np.uint8)
            headers, tensors = blocks_for(size, plan.block_bytes)
            into = pool.take_for(headers)

            def ours(h: Any = headers, t: Any = tensors, i: Any = into) -> None:
                spec = TransferSpec.for_headers(next(ids), b.address, h)
                back = TransferSpec.for_headers(spec.transfer_id, a.address, h)

                async def both() -> None:
                    await asyncio.gather(a.asend(spec, h, t), b.arecv(back, into=i))

                a.run(both())  # NOTE: the endpoints' shared loop; one hand-off there and back

            def copy(s: np.ndarray = src, d: np.ndarray = dst) -> None:
                np.copyto(d, s)

            raw = _timed(plan, copy)
            rows.append(_timed_row("local", size, len(headers), plan.block_bytes, _timed(plan, ours), raw))
    finally:
        a.close()
        b.close()
    return rows


def ray_put(size: int) -> list[Any]:
    """Raw Ray: put a buffer made once per size (outside the timed transfers, as ours' blocks are)."""
    import ray

    if size not in _RAY_RAW:
        _RAY_RAW[size] = np.ones(size, np.uint8)
    return [ray.put(_RAY_RAW[size])]


def ray_get(refs: list[Any]) -> int:
    import ray

    return int(ray.get(refs[0]).nbytes)


def ray_side(role: int, name: str, peer: str, size: int, block_bytes: int, transfer_id: int) -> float:
    from transport.ray_store import RayTransport

    global _RAY_T
    if _RAY_T is None:
        _RAY_T = RayTransport(TransportConfig(timeout_s=120), name=name)
    if (size, block_bytes) not in _RAY_BLOCKS:  # NOTE: made once per size, outside the timed transfers
        _RAY_BLOCKS[(size, block_bytes)] = blocks_for(size, block_bytes)
    headers, tensors = _RAY_BLOCKS[(size, block_bytes)]
    spec = TransferSpec.for_headers(transfer_id, peer, headers)
    start = time.perf_counter()
    if role == 0:
        _RAY_T.send(spec, headers, tensors)
    else:
        _RAY_T.recv(spec)
    return time.perf_counter() - start


_RAY_T: Any = None
_RAY_BLOCKS: dict[tuple[int, int], Any] = {}
_RAY_RAW: dict[int, np.ndarray] = {}


def _bench_ray(plan: BenchPlan) -> list[TransportRow]:
    from graphflow.runtime.actors import call_worker
    from graphflow.runtime.cluster import start_local

    ray = start_local()
    workers = [call_worker(ray, num_cpus=0) for _ in range(2)]
    names = [f"bench-{time.time_ns()}-{r}" for r in (0, 1)]
    ids = iter(range(1, 1 << 30))
    rows = []
    try:
        for size in plan.sizes:

            def raw(n: int = size) -> None:
                # NOTE: both calls go out at once, as ours' do; Ray hands the put's refs to the
                # getter when the put returns (no round trip through this process in between)
                refs = workers[0].call.remote(f"{__name__}:ray_put", n)
                ray.get(workers[1].call.remote(f"{__name__}:ray_get", refs))

            def ours(n: int = size) -> None:
                tid = next(ids)
                calls = [
                    workers[r].call.remote(f"{__name__}:ray_side", r, names[r], names[1 - r], n, plan.block_bytes, tid)
                    for r in (0, 1)
                ]
                ray.get(calls)

            blocks = len(blocks_for(size, plan.block_bytes)[0])
            rows.append(_timed_row("ray", size, blocks, plan.block_bytes, _timed(plan, ours), _timed(plan, raw)))
    finally:
        for w in workers:
            ray.kill(w)
    return rows


def bench_transport(
    backends: list[str], plan: BenchPlan, say: Callable[[str], None] = lambda _m: None, peers: Sequence[str] = ()
) -> tuple[list[TransportRow], list[PeerResult]]:
    """A row for every backend × size (ucx and mpi rows also time bare, see ``transport_pair``),
    and one result per peer (``graphflow.bench.peers.run_peer``: its rows, or why it could not
    run); with peers, the ucx rows carry each peer's rate at their size."""
    from graphflow.bench.peers import PEERS, run_peer

    for backend in backends:  # NOTE: before any runs, so a typo does not throw away the backends timed before it
        check_backend(backend)
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer {unknown[0]!r}; use {', '.join(PEERS)}")
    rows: list[TransportRow] = []
    for backend in backends:
        say(f"benchmarking {backend}")
        if backend == "local":
            rows += _bench_local(plan)
        elif backend == "ray":
            rows += _bench_ray(plan)
        else:
            from graphflow.harness.launch import run_two_processes

            args = ["--job", "bench", *plan.args(), "--timeout", "120"]
            rows += [TransportRow.from_json(r) for r in run_two_processes(backend, args, timeout_s=1800)[0]]
    results = []
    for peer in peers:
        say(f"benchmarking peer {peer}")
        results.append(run_peer(peer, plan))
        if results[-1].unavailable:
            say(results[-1].unavailable)
    return with_peers(rows, results), results
