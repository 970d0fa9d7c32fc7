"""Peer rows of ``graphflow bench transport``: the transfer libraries serving stacks use, moving
the same blocks between two processes of this host.

* ``nixl`` — NVIDIA's NIXL (``nixl-cu12``) with its UCX backend, DRAM → DRAM: the receiver
  ``READ``s the sender's registered blocks into its own registered blocks (one descriptor per
  block), agent metadata and descriptor lists exchanged out of band (a shared folder).
* ``mooncake`` — Mooncake Transfer Engine (``mooncake-transfer-engine-non-cuda``) over TCP with
  its peer-to-peer handshake (no metadata server): the receiver reads every block with one
  ``batch_transfer_sync_read``.

Both are set up as ours is in ``transport_pair``: the same block sizes and contents
(``blocks_for``), receive blocks taken once per size from the same pool and reused for every
transfer, the same warm-up, ``iters`` back-to-back transfers per measurement, the median of
``repeats`` measurements. Each transfer is timed by the reader from posting the read to its
completion. Neither library checks the bytes it moves (ours hashes every block on arrival);
after the timed transfers the receiver clears its blocks, reads once more and compares every
byte with the sender's, so a row is only reported for bytes that arrived.

Run by ``python -m graphflow.bench.peers --peer nixl|mooncake --role 0|1 --rendezvous DIR …``
(two processes, see :func:`run_peer`); role 0 holds the blocks, role 1 reads them and writes
the rows. A peer that cannot load here writes why instead of rows, and the benchmark goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from graphflow.bench.transport_pair import BenchPlan, blocks_for
from graphflow.bench.transport_rows import PeerResult, PeerRow
from graphflow.harness.rendezvous import write_result
from transport.pool import TensorPool

__all__ = ["PEERS", "run_peer"]

PEERS = ("nixl", "mooncake")
_INSTALL = "install the peers extra (pip install -e '.[peers]')"


def run_peer(peer: str, plan: BenchPlan, timeout_s: float = 1800) -> PeerResult:
    """Both processes of ``peer`` over ``plan``: its rows, or why it cannot load here."""
    from graphflow.harness.launch import run_module_pair

    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; use {', '.join(PEERS)}")
    args = ["--peer", peer, *plan.args(), "--timeout", str(timeout_s)]
    holder, reader = run_module_pair(__name__, args, timeout_s)
    for side in (reader, holder):
        if "unavailable" in side:
            return PeerResult(peer, unavailable=side["unavailable"])
    return PeerResult(peer, tuple(PeerRow.from_json(r) for r in reader["rows"]))


def _unavailable(peer: str, exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if "libibverbs" in text:
        return f"{peer} cannot load: {text} (it needs Debian's libibverbs1 even for TCP: apt-get install libibverbs1)"
    if isinstance(exc, ImportError):
        return f"{peer} is not installed here ({text}); {_INSTALL}"
    return f"{peer} cannot start here: {text}"


def _publish(folder: Path, role: int, obj: dict[str, Any]) -> None:
    tmp = folder / f".peer{role}.json"
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, folder / f"peer{role}.json")


def _await(path: Path, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other process did not write {path.name} within {timeout_s:g} s")
        time.sleep(0.005)
    return dict(json.loads(path.read_text()))


class _Side(Protocol):
    """What a peer library provides for one process of the pair."""

    def hold(self, sizes: list[int], blocks: dict[int, list[torch.Tensor]]) -> dict[str, Any]:
        """Register the sender's blocks; return what the reader needs to reach them."""

    def connect(self, holder: dict[str, Any], into: dict[int, list[torch.Tensor]]) -> None:
        """Register the receive blocks and reach the holder from what it published."""

    def read(self, size: int) -> None:
        """One transfer of all of ``size``'s blocks into the receive blocks, to completion."""

    def close(self) -> None:
        """Release what the library holds."""


class _Nixl:
    def __init__(self, role: int) -> None:
        from nixl_cu12._api import nixl_agent, nixl_agent_config

        self.agent = nixl_agent(f"graphflow-peer-{role}-{os.getpid()}", nixl_agent_config(backends=["UCX"]))
        self.handles: dict[int, Any] = {}
        self.registered: list[Any] = []
        self.remote: Any = None

    def hold(self, sizes: list[int], blocks: dict[int, list[torch.Tensor]]) -> dict[str, Any]:
        descs = {}
        for size in sizes:
            self.registered.append(self.agent.register_memory(blocks[size]))
            descs[str(size)] = self.agent.get_serialized_descs(self.agent.get_xfer_descs(blocks[size])).hex()
        return {"meta": self.agent.get_agent_metadata().hex(), "descs": descs}

    def connect(self, holder: dict[str, Any], into: dict[int, list[torch.Tensor]]) -> None:
        self.remote = remote = self._add_remote(bytes.fromhex(holder["meta"]))
        for size, tensors in into.items():
            self.registered.append(self.agent.register_memory(tensors))
            local = self.agent.get_xfer_descs(tensors)
            far = self.agent.deserialize_descs(bytes.fromhex(holder["descs"][str(size)]))
            # NOTE: one request per size, posted again for every transfer (as a KV connector reuses its handles)
            self.handles[size] = self.agent.initialize_xfer("READ", local, far, remote)

    def _add_remote(self, meta: bytes, attempts: int = 40) -> Any:
        """The holder's agent, retried: here its UCX endpoint sometimes refused the first
        connection (``NIXL_ERR_BACKEND``) and took the same metadata a moment later."""
        from nixl_cu12._bindings import nixlBackendError

        for attempt in range(attempts):
            try:
                return self.agent.add_remote_agent(meta)
            except nixlBackendError:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.25)
        raise AssertionError("unreachable")

    def read(self, size: int) -> None:
        handle = self.handles[size]
        state = self.agent.transfer(handle)
        while state == "PROC":
            state = self.agent.check_xfer_state(handle)
        if state != "DONE":
            raise RuntimeError(f"NIXL READ of {size} bytes ended in state {state}")

    def close(self) -> None:
        # NOTE: in this order, while the blocks are alive; left to the interpreter's exit, NIXL crashed here
        for h in self.handles.values():
            self.agent.release_xfer_handle(h)
        for reg in self.registered:
            self.agent.deregister_memory(reg)
        if self.remote is not None:
            self.agent.remove_remote_agent(self.remote)
        del self.agent


class _Mooncake:
    def __init__(self, role: int) -> None:
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        if self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise RuntimeError("TransferEngine.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp') failed")
        self.target = ""
        self.plans: dict[int, tuple[list[int], list[int], list[int]]] = {}

    def _register(self, tensors: list[torch.Tensor]) -> list[int]:
        addrs = [t.data_ptr() for t in tensors]
        if self.engine.batch_register_memory(addrs, [t.nbytes for t in tensors]) != 0:
            raise RuntimeError("Mooncake could not register the blocks")
        return addrs

    def hold(self, sizes: list[int], blocks: dict[int, list[torch.Tensor]]) -> dict[str, Any]:
        addrs = {str(size): self._register(blocks[size]) for size in sizes}
        return {"session": f"127.0.0.1:{self.engine.get_rpc_port()}", "addrs": addrs}

    def connect(self, holder: dict[str, Any], into: dict[int, list[torch.Tensor]]) -> None:
        self.target = holder["session"]
        for size, tensors in into.items():
            self.plans[size] = (self._register(tensors), holder["addrs"][str(size)], [t.nbytes for t in tensors])

    def read(self, size: int) -> None:
        local, far, lengths = self.plans[size]
        if self.engine.batch_transfer_sync_read(self.target, local, far, lengths) != 0:
            raise RuntimeError(f"Mooncake read of {size} bytes from {self.target} failed")

    def close(self) -> None:
        pass  # NOTE: the engine has no shutdown call; it goes with the process


_SIDES: dict[str, Callable[[int], _Side]] = {"nixl": _Nixl, "mooncake": _Mooncake}


def _per_transfer_s(plan: BenchPlan, step: Callable[[], None]) -> float:
    for _ in range(plan.warmup):
        step()
    start = time.perf_counter()
    for _ in range(plan.iters):
        step()
    return (time.perf_counter() - start) / plan.iters


def _side(peer: str, role: int, folder: Path, plan: BenchPlan, timeout_s: float) -> dict[str, Any]:
    try:
        side = _SIDES[peer](role)
    except (ImportError, OSError, RuntimeError) as exc:
        why = {"unavailable": _unavailable(peer, exc)}
        _publish(folder, role, why)  # NOTE: so the other process stops waiting for this one
        return why
    try:
        blocks = {size: blocks_for(size, plan.block_bytes) for size in plan.sizes}
        if role == 0:
            _publish(folder, 0, side.hold(plan.sizes, {s: b[1] for s, b in blocks.items()}))
            done = _await(folder / "peer1.json", timeout_s)  # NOTE: the holder stays until the reader is done
            return {"reader": done.get("status", done.get("unavailable", ""))}
        pool = TensorPool(max_free_bytes=4 << 30)
        into = {size: pool.take_for(headers) for size, (headers, _) in blocks.items()}
        holder = _await(folder / "peer0.json", timeout_s)
        if "unavailable" in holder:
            return holder
        try:
            side.connect(holder, into)
            rows = [_measure(side, plan, size, blocks[size][1], into[size]).to_json() for size in plan.sizes]
        except BaseException:
            _publish(folder, 1, {"status": "failed"})
            raise
        _publish(folder, 1, {"status": "done"})
        return {"rows": rows}
    finally:
        side.close()


def _measure(side: _Side, plan: BenchPlan, size: int, sent: list[torch.Tensor], into: list[torch.Tensor]) -> PeerRow:
    times = [_per_transfer_s(plan, lambda: side.read(size)) for _ in range(plan.repeats)]
    for t in into:
        t.zero_()
    side.read(size)
    if not all(torch.equal(a, b) for a, b in zip(into, sent, strict=True)):
        raise RuntimeError(f"{size} bytes read by the peer library differ from the sender's")
    return PeerRow(size, len(sent), statistics.median(times), checksums=False, verified_after=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--peer", choices=PEERS, required=True)
    p.add_argument("--role", type=int, choices=(0, 1), required=True)
    p.add_argument("--rendezvous", required=True)
    p.add_argument("--sizes", required=True)
    p.add_argument("--block-bytes", type=int, default=1 << 20)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args(argv)
    plan = BenchPlan([int(s) for s in a.sizes.split(",")], a.block_bytes, a.iters, a.warmup, a.repeats)
    folder = Path(a.rendezvous)
    result = _side(a.peer, a.role, folder, plan, a.timeout)
    write_result(folder, a.role, result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # NOTE: NIXL 1.5.1 segfaults in the interpreter's teardown here, after a clean close()


if __name__ == "__main__":
    main()
