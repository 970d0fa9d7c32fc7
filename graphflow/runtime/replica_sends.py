"""What a replica sends: its stored blocks to a peer, synthetic probes for link calibration,
and the faults ``graphflow check faults`` injects into its next send.

The receiving side stays with the node that waits for the blocks (``ReplicaWorker``); this
side runs on the sender's actor thread and only reads the store, under the replica's lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from graphflow.kv.errors import MissingBlocks
from graphflow.kv.events import EvictEvent
from graphflow.kv.exchange import send_blocks
from graphflow.kv.keys import chain_keys
from graphflow.kv.store import BlockStore
from graphflow.runtime.deliveries import Deliveries
from transport.base import TransferSpec, Transport

__all__ = ["FAULTS", "Sends"]

FAULTS = ("drop-send", "corrupt-send", "corrupt-store", "lose-send")


class Sends:
    """The sending side of one replica.

    Args:
        name: the replica's name (in errors).
        transport: its endpoint.
        store: its block store, read under ``lock``.
        lock: the replica's store lock.
        model_key: the model whose block chain keys are looked up.
        block_tokens: tokens per block.
        block_bytes: bytes of one full block (the probe's block size).
        deliveries: where a send that finds blocks gone records them, for the replica's next
            result to tell the manager (which listed them here, or it would not have asked).
        stamp: the replica's change stamps (``graphflow.kv.copy_order``), called under ``lock``.
    """

    def __init__(
        self,
        name: str,
        transport: Transport,
        store: BlockStore,
        lock: threading.RLock,
        model_key: str,
        block_tokens: int,
        block_bytes: int,
        deliveries: Deliveries,
        stamp: Callable[[], int],
    ) -> None:
        self.name = name
        self.deliveries = deliveries
        self.stamp = stamp
        self.transport = transport
        self.store = store
        self.lock = lock
        self.model_key = model_key
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self._faults: list[str] = []

    def inject_fault(self, fault: str, held: Iterable[str]) -> None:
        """The next send misbehaves once (``corrupt-store`` acts now, on the states ``held``).

        ``drop-send`` sends nothing (the receiver times out); ``corrupt-send`` flips one payload
        byte after the checksums were taken (the receiver's verification must catch it);
        ``corrupt-store`` flips one byte of every stored block now, in place (reuse must catch it);
        ``lose-send`` fails the send as if the blocks were evicted first (``MissingBlocks``: the
        executor must call the receive off).
        """
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")
        if fault == "corrupt-store":
            with self.lock:
                seen: set[int] = set()
                for sid in held:
                    for b in self.store.blocks(sid):
                        if b.key not in seen:  # NOTE: flipping a shared block twice would heal it
                            seen.add(b.key)
                            b.tensor.view(torch.uint8).view(-1)[0] ^= 0xFF
            return
        self._faults.append(fault)

    def send_blocks(self, tokens: Sequence[int], lo: int, peer: str, transfer_id: int) -> int:
        """Send the blocks of ``tokens[lo:]`` (full blocks, in the chain of ``tokens``) to
        ``peer``; returns bytes sent. Raises ``MissingBlocks`` if the store lost any."""
        bt = self.block_tokens
        n = len(tokens) // bt * bt
        keys = chain_keys(list(tokens[:n]), self.model_key, bt)[lo // bt :]
        with self.lock:
            missing = [k for k in keys if not self.store.has_block(k)]
            if missing:
                self.deliveries.wait([EvictEvent(self.name, tuple(missing), stamp=self.stamp())])
                raise MissingBlocks(f"replica {self.name} no longer holds {len(missing)} of the blocks asked for")
            blocks = [self.store.block(k) for k in keys]
        fault = self._faults.pop(0) if self._faults else ""
        if fault == "drop-send":
            return 0
        if fault == "lose-send":
            raise MissingBlocks(f"replica {self.name} lost the blocks asked for (injected fault)")
        if fault == "corrupt-send":
            from graphflow.kv.codec import to_wire

            headers, tensors = to_wire(blocks)
            tensors = [t.clone() for t in tensors]
            tensors[0].view(torch.uint8).view(-1)[0] ^= 0xFF
            return self.transport.send(TransferSpec.for_headers(transfer_id, peer, headers), headers, tensors).nbytes
        return send_blocks(self.transport, blocks, peer, transfer_id).nbytes

    def probe(self, peer: str, nbytes: int, transfer_id: int, send: bool) -> float:
        """One synthetic transfer of ``nbytes`` in blocks of ``block_bytes``, to or from
        ``peer``; returns the receiver's measured seconds (0 on the sending side)."""
        from transport.probe import probe_blocks

        headers, tensors = probe_blocks(nbytes, self.block_bytes)
        if send:
            self.transport.send(TransferSpec.for_headers(transfer_id, peer, headers), headers, tensors)
            return 0.0
        start = time.perf_counter()
        self.transport.recv(TransferSpec.for_headers(transfer_id, peer, headers))
        return time.perf_counter() - start
