"""Test helper: a UCX or MPI sender that starts a transfer and dies halfway through it.

It sends the transfer's first message (preamble + header announcing big blocks) and the
first block, then kills itself with ``os._exit`` — no clean-up, as a crash would.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from graphflow.harness.rendezvous import exchange_addresses
from transport.base import TransferSpec, TransportConfig
from transport.checksums import checksum
from transport.registry import create
from transport.wire import WIRE_VERSION, BlockHeader, encode_header

BLOCK = 8 << 20


def blocks() -> list[BlockHeader]:
    t = torch.ones(BLOCK, dtype=torch.uint8)
    return [BlockHeader(i + 1, i, 0, (), "uint8", (BLOCK,), BLOCK, checksum(t)) for i in range(4)]


def main() -> None:
    backend, folder = sys.argv[1], Path(sys.argv[2])
    t = create(backend, TransportConfig(timeout_s=30))
    peer = "1" if backend == "mpi" else exchange_addresses(folder, 0, t.address)
    if backend == "mpi" and t.address != "0":
        from tests.integration.helpers.receiver import receive

        receive(t, "0", folder)
        return
    headers = blocks()
    spec = TransferSpec.for_headers(7, peer, headers)
    header = encode_header(headers)
    import struct

    first = struct.pack("<4sHQ", b"GFKV", WIRE_VERSION, len(header)) + header
    t.run(t._send_msg(spec, 0, memoryview(first)))  # type: ignore[attr-defined]
    time.sleep(0.5)
    os._exit(3)


if __name__ == "__main__":
    main()
