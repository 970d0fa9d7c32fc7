"""Test helper: receive transfer 7 (see dying_sender) and report how it ended."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from graphflow.harness.rendezvous import exchange_addresses
from transport.base import TransferSpec, Transport, TransportConfig
from transport.registry import create


def receive(t: Transport, peer: str, folder: Path) -> None:
    from tests.integration.helpers.dying_sender import blocks

    spec = TransferSpec.for_headers(7, peer, blocks())
    start = time.monotonic()
    try:
        t.recv(spec)
        outcome = "received"
    except Exception as exc:  # noqa: BLE001 - the test inspects the type
        outcome = type(exc).__name__
    (folder / "outcome.json").write_text(json.dumps({"outcome": outcome, "seconds": time.monotonic() - start}))


def main() -> None:
    backend, folder, timeout = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    t = create(backend, TransportConfig(timeout_s=timeout))
    peer = exchange_addresses(folder, 1, t.address)
    receive(t, peer, folder)
    t.close()


if __name__ == "__main__":
    main()
