"""Test helper, run as ``mpirun -n 2``: KV transfers between two ranks of one host with the
sender writing into the receiver (``MpiTransport`` single copy), and with it turned off.

Rank 1 writes ``outcome.json`` into the folder given as the first argument.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from transport import cma
from transport.base import TransferSpec, TransportConfig
from transport.checksums import checksum
from transport.errors import ChecksumMismatch, TransportError
from transport.layout import MESSAGE_BYTES
from transport.mpi import MpiTransport
from transport.wire import BlockHeader

BLOCK = 1 << 20


def blocks(seed: int) -> tuple[list[BlockHeader], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    n = MESSAGE_BYTES // BLOCK + 3  # NOTE: two data messages, both ≥ SINGLE_COPY_MIN_BYTES in all
    tensors = [torch.randint(0, 255, (BLOCK,), dtype=torch.uint8, generator=g) for _ in range(n)]
    headers = [BlockHeader(i + 1, i, i * 16, (), "uint8", (BLOCK,), BLOCK, checksum(t)) for i, t in enumerate(tensors)]
    return headers, tensors


def run(t: MpiTransport, seed: int, tid: int) -> dict[str, object]:
    """One transfer 0 → 1; rank 1 reports whether the blocks arrived intact."""
    rank, peer = int(t.address), str(1 - int(t.address))
    headers, tensors = blocks(seed)
    spec = TransferSpec.for_headers(tid, peer, headers)
    if rank == 0:
        t.send(spec, headers, tensors)
        return {}
    got = t.recv(spec)
    return {"equal": all(torch.equal(a, b) for a, b in zip(got.tensors, tensors, strict=True))}


def main() -> None:
    folder = Path(sys.argv[1])
    on = MpiTransport(TransportConfig(timeout_s=5))
    off = MpiTransport(TransportConfig(timeout_s=5), single_copy=False)
    rank = int(on.address)
    out: dict[str, object] = {"single_copy_peers": sorted(on.single_copy_peers)}
    out["off_peers"] = sorted(off.single_copy_peers)
    out["on"] = run(on, 1, 11)
    out["off"] = run(off, 2, 12)
    out["written"] = [on.single_copy_writes, off.single_copy_writes]
    headers, tensors = blocks(3)
    if rank == 0:  # a block whose bytes are not what its header announces
        bad = [h if i != 5 else dataclasses.replace(h, checksum=h.checksum ^ 1) for i, h in enumerate(headers)]
        on.send(TransferSpec.for_headers(13, "1", bad), bad, tensors)
        time.sleep(2.0)  # NOTE: rank 1 gives up on transfer 14 meanwhile; then this send must fail, not write
        try:
            on.send(TransferSpec.for_headers(14, "1", headers), headers, tensors)
            out["late"] = "sent"
        except TransportError as exc:
            out["late"] = type(exc).__name__
        on.comm.Barrier()
    else:
        try:
            on.recv(TransferSpec.for_headers(13, "0", headers))
            out["flipped"] = "accepted"
        except ChecksumMismatch:
            out["flipped"] = "ChecksumMismatch"
        into = [torch.zeros(BLOCK, dtype=torch.uint8) for _ in headers]
        try:
            on.config = TransportConfig(timeout_s=0.5)
            on.recv(TransferSpec.for_headers(14, "0", headers), into=into)
            out["abandoned"] = "received"
        except TransportError as exc:
            out["abandoned"] = type(exc).__name__
        on.comm.Barrier()
        out["into_untouched"] = all(int(t.count_nonzero()) == 0 for t in into)

    # a sender that cannot write (here: every write refused) sends the bytes as messages instead
    def refuse(*_args: object) -> None:
        raise cma.CrossMemoryError(1, "not permitted")

    cma.write = refuse  # type: ignore[assignment]
    written = on.single_copy_writes
    out["refused"] = run(on, 4, 15)
    out["refused_writes"] = on.single_copy_writes - written
    on.close()
    off.close()
    if rank == 1:
        (folder / "outcome.json").write_text(json.dumps(out))
    else:
        (folder / "sender.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
