"""KV transfer check: a real KV state moves between two processes over a transport backend and
the receiver resumes decoding bit-identically.

```
role 0 (sender):   prefill N tokens ─► blocks ─► transport.send ──────────────┐
                   decode 16 from its own cache (reference) ─► expected.json   │
role 1 (receiver): keys from the same tokens ─► TransferSpec ─► transport.recv ◄┘
                   ─► blocks ─► cache ─► decode 16 ─► compare with expected
```

Both sides know the prompt tokens, so the receiver derives the block keys and sizes itself
(the KV manager's job in the running system). The reference tokens and the first decode
token travel as a small JSON file in the rendezvous folder, never the KV.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from graphflow.kv.codec import from_wire, to_wire
from graphflow.kv.exchange import spec_for_prompt
from graphflow.kv.packing import blocks_to_cache, cache_to_blocks
from graphflow.models.engine import Engine, clone_cache
from graphflow.models.prompts import prompt_token_ids
from transport.base import TransferSpec, Transport
from transport.registry import check_backend

__all__ = ["Received", "Sent", "TransferCheck", "TransferCheckResult", "receive_side", "send_side"]

TRANSFER_ID = 4242


@dataclass(frozen=True, slots=True)
class TransferCheck:
    model: str = "tiny-llama"
    tokens: int = 200
    steps: int = 16
    block_tokens: int = 16


@dataclass(frozen=True, slots=True)
class Sent:
    """The sender's side: what it sent and how long ``send`` took."""

    blocks: int
    nbytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Received:
    """The receiver's side: what arrived, and whether decoding resumed as on the sender."""

    backend: str
    pid: int
    blocks: int
    nbytes: int
    seconds: float  # transport.recv, from posting to the last block checked
    same_config: bool  # the two sides loaded the same model configuration
    tokens_equal: bool  # greedy tokens after resuming equal the sender's
    max_abs_logit_diff: float


@dataclass(frozen=True, slots=True)
class TransferCheckResult:
    received: Received
    send_seconds: float
    processes: int  # 1 for the local backend (two threads), else 2

    @property
    def passed(self) -> bool:
        return self.received.same_config and self.received.tokens_equal

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self.received), "send_seconds": self.send_seconds, "processes": self.processes}


def send_side(check: TransferCheck, transport: Transport, peer: str, rendezvous: Path) -> Sent:
    engine = Engine.load(check.model, linear_kernel="torch")  # NOTE: one kernel in both processes (bit-exact)
    ids = prompt_token_ids(engine.tokenizer, check.tokens)
    pre = engine.prefill(ids)
    first = int(torch.argmax(pre.logits))
    ref = engine.decode_greedy(clone_cache(pre.cache), first, check.steps)
    expected = {"first_token": first, "tokens": list(ref.token_ids), "config_hash": engine.identity.config_hash}
    tmp = rendezvous / ".expected.json"
    tmp.write_text(json.dumps(expected))
    tmp.rename(rendezvous / "expected.json")
    torch.save(ref.logits, rendezvous / "expected_logits.pt")
    blocks = cache_to_blocks(pre.cache, ids, engine.identity, check.block_tokens)
    headers, tensors = to_wire(blocks)
    stats = transport.send(TransferSpec.for_headers(TRANSFER_ID, peer, headers), headers, tensors)
    return Sent(len(blocks), stats.nbytes, stats.seconds)


def receive_side(check: TransferCheck, transport: Transport, peer: str, rendezvous: Path) -> Received:
    engine = Engine.load(check.model, linear_kernel="torch")  # NOTE: one kernel in both processes (bit-exact)
    ids = prompt_token_ids(engine.tokenizer, check.tokens)
    received = transport.recv(spec_for_prompt(engine.identity, ids, check.block_tokens, peer, TRANSFER_ID))
    cache = blocks_to_cache(from_wire(received.headers, received.tensors), engine.identity, engine.config)
    expected_path = rendezvous / "expected.json"
    deadline = time.monotonic() + 60
    while not expected_path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    expected = json.loads(expected_path.read_text())
    out = engine.decode_greedy(cache, expected["first_token"], check.steps)
    ref_logits = torch.load(rendezvous / "expected_logits.pt")
    return Received(
        transport.name,
        os.getpid(),
        len(received.headers),
        received.stats.nbytes,
        received.stats.seconds,
        same_config=expected["config_hash"] == engine.identity.config_hash,
        tokens_equal=list(out.token_ids) == expected["tokens"],
        max_abs_logit_diff=float((out.logits - ref_logits).abs().max()),
    )


def side_json(role: int, check: TransferCheck, transport: Transport, peer: str, folder: Path) -> dict[str, Any]:
    """One side's result as JSON (what crosses a process boundary)."""
    return asdict((send_side if role == 0 else receive_side)(check, transport, peer, folder))


def ray_side(role: int, check: TransferCheck, folder: str, timeout_s: float) -> dict[str, Any]:
    """Run one side inside a Ray worker process (called through ``CallWorker``)."""
    from transport.base import TransportConfig
    from transport.ray_store import RayTransport

    transport = RayTransport(TransportConfig(timeout_s=timeout_s), name=f"{folder}:{role}")
    try:
        return side_json(role, check, transport, f"{folder}:{1 - role}", Path(folder))
    finally:
        transport.close()


def run_transfer_check(backend: str, check: TransferCheck, timeout_s: float = 60.0) -> TransferCheckResult:
    """Move a KV state between two processes (two threads for ``local``) and resume decoding.

    Returns the receiver's result and the sender's timing. Raises ``TransportError`` when the
    pair fails and ``ValueError`` for an unknown backend.
    """
    import tempfile
    import threading

    from transport.base import TransportConfig
    from transport.local import LocalTransport

    check_backend(backend)
    if backend in ("ucx", "mpi"):
        from graphflow.harness.launch import run_two_processes

        args = ["--job", "transfer", "--model", check.model, "--tokens", str(check.tokens), "--timeout", str(timeout_s)]
        sent_json, got_json = run_two_processes(backend, args, timeout_s * 3 + 120)
        sent, got = Sent(**sent_json), Received(**got_json)
    elif backend == "ray":
        from graphflow.runtime.actors import call_worker
        from graphflow.runtime.cluster import start_local

        ray = start_local()
        with tempfile.TemporaryDirectory(prefix="graphflow-ray-") as folder:
            workers = [call_worker(ray, num_cpus=0) for _ in range(2)]
            refs = [w.call.remote(f"{__name__}:ray_side", r, check, folder, timeout_s) for r, w in enumerate(workers)]
            sent_json, got_json = ray.get(refs, timeout=timeout_s * 3 + 120)
            sent, got = Sent(**sent_json), Received(**got_json)
            for w in workers:
                ray.kill(w)
    else:  # NOTE: local (check_backend lets only the four through)
        config = TransportConfig(timeout_s=timeout_s)
        with tempfile.TemporaryDirectory(prefix="graphflow-local-") as folder:
            a, b = LocalTransport(config), LocalTransport(config)
            out: dict[int, Sent] = {}
            sender = threading.Thread(target=lambda: out.setdefault(0, send_side(check, a, b.address, Path(folder))))
            sender.start()
            try:
                got = receive_side(check, b, a.address, Path(folder))
            finally:
                sender.join()
                a.close()
                b.close()
            sent = out[0]
    return TransferCheckResult(got, sent.seconds, 1 if backend == "local" else 2)
