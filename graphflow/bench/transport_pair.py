"""One side of the two-process transport benchmark (run as a process; see ``bench/transport.py``).

Rank 0 sends, rank 1 receives. For each size, both sides first run the raw reference (one
plain message of ``size`` bytes per iteration over the same backend: an ucxx ``send`` of a
numpy buffer, an MPI ``Send``), then ours (a KV transfer of ``size`` bytes cut into blocks of
``block_bytes``, header, checksums and all, received into pooled tensors). Each measurement
is ``iters`` back-to-back transfers closed by one acknowledgement, after ``warmup`` untimed
ones; the sender reports seconds per transfer. Rank 0 writes the rows as JSON.

Usage: ``python -m graphflow.bench.transport_pair --backend ucx|mpi --role 0|1 --rendezvous DIR
--sizes 1048576,... --block-bytes N --iters N --warmup N --repeats N --out rows.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from transport.base import MessageTransport, TransferSpec, TransportConfig
from transport.pool import TensorPool
from transport.registry import create
from transport.wire import BlockHeader, checksum

_ids = itertools.count(1)


def blocks_for(size: int, block_bytes: int) -> tuple[list[BlockHeader], list[torch.Tensor]]:
    """Deterministic blocks totalling ``size`` bytes (the last one may be smaller)."""
    g = torch.Generator().manual_seed(size)
    headers, tensors = [], []
    for i, lo in enumerate(range(0, size, block_bytes)):
        n = min(block_bytes, size - lo)
        t = torch.randint(0, 255, (n,), dtype=torch.uint8, generator=g)
        headers.append(BlockHeader(i + 1, i, lo, (), "uint8", (n,), n, checksum(t)))
        tensors.append(t)
    return headers, tensors


def _exchange(rendezvous: Path, role: int, address: str) -> str:
    mine, theirs = rendezvous / f"addr{role}", rendezvous / f"addr{1 - role}"
    tmp = rendezvous / f".addr{role}"
    tmp.write_text(address)
    tmp.rename(mine)
    deadline = time.monotonic() + 60
    while not theirs.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the peer process never published its address")
        time.sleep(0.01)
    return theirs.read_text()


def _timed(
    role: int, iters: int, warmup: int, step: Callable[[], None], ack: Callable[[], None], wait_ack: Callable[[], None]
) -> float:
    for _ in range(warmup):
        step()
    (wait_ack if role == 0 else ack)()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    (wait_ack if role == 0 else ack)()
    return (time.perf_counter() - start) / iters


def run(args: argparse.Namespace) -> list[dict[str, float | int | str]]:
    t: MessageTransport = create(args.backend, TransportConfig(timeout_s=args.timeout))  # type: ignore[assignment]
    peer = str(1 - args.role) if args.backend == "mpi" else _exchange(Path(args.rendezvous), args.role, t.address)
    ack_buf = bytearray(1)
    control = TransferSpec(0, peer, (), ())

    def ack() -> None:
        t.run(t._send_msg(control, 1 << 19, memoryview(ack_buf)))

    def wait_ack() -> None:
        t.run(t._recv_msg(control, 1 << 19, memoryview(ack_buf)))

    rows: list[dict[str, float | int | str]] = []
    pool = TensorPool(max_free_bytes=4 << 30)
    for size in args.sizes:
        raw_buf = np.ones(size, np.uint8) if args.role == 0 else np.zeros(size, np.uint8)
        raw_spec = TransferSpec(0, peer, (), ())
        headers, tensors = blocks_for(size, args.block_bytes)
        into = pool.take_for(headers)

        if args.backend == "mpi":
            comm = t.comm  # type: ignore[attr-defined]

            def raw_step() -> None:
                if args.role == 0:
                    comm.Send(raw_buf, dest=1, tag=7)
                else:
                    comm.Recv(raw_buf, source=0, tag=7)

        else:

            def raw_step() -> None:
                view = raw_buf.data
                t.run(t._send_msg(raw_spec, 7, view) if args.role == 0 else t._recv_msg(raw_spec, 7, view))

        def ours_step() -> None:
            spec = TransferSpec.for_headers(next(_ids), peer, headers)
            if args.role == 0:
                t.send(spec, headers, tensors)
            else:
                got = t.recv(spec, into=into)
                assert got.tensors[0] is into[0]

        raw_s, ours_s = [], []
        for _ in range(args.repeats):
            raw_s.append(_timed(args.role, args.iters, args.warmup, raw_step, ack, wait_ack))
            ours_s.append(_timed(args.role, args.iters, args.warmup, ours_step, ack, wait_ack))
        if args.role == 1:
            assert all(torch.equal(a, b) for a, b in zip(into, tensors, strict=True)), "received bytes differ"
        raw, ours = statistics.median(raw_s), statistics.median(ours_s)
        rows.append(
            {
                "backend": args.backend,
                "nbytes": size,
                "blocks": len(headers),
                "block_bytes": args.block_bytes,
                "ours_s": ours,
                "raw_s": raw,
                "ours_gbps": size / ours / 1e9,
                "raw_gbps": size / raw / 1e9,
                "ratio": raw / ours,
                "overhead_us": (ours - raw) * 1e6,
            }
        )
    t.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backend", choices=["ucx", "mpi"], required=True)
    p.add_argument("--role", type=int, default=-1)
    p.add_argument("--rendezvous", default="")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], required=True)
    p.add_argument("--block-bytes", type=int, default=1 << 20)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.backend == "mpi":
        from mpi4py import MPI

        args.role = MPI.COMM_WORLD.Get_rank()
    rows = run(args)
    if args.role == 0:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f)
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
