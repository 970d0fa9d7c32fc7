"""Stateful KV operators (AAFLOW+ Op^s): materialize, transfer, fork, restricted merge, evict.

Each works on a replica's :class:`BlockStore` and, when given, reports to the
:class:`KVStateManager` so the catalog and lineage stay true. Contracts:

| operator | mutates | guarantees |
|---|---|---|
| materialize | store (+ manager) | block keys are the hash chain of the tokens |
| transfer | destination store (+ manager) | only missing blocks move; bytes checksum-verified |
| fork | store (+ manager) | no bytes copied; children share every block |
| merge | store (+ manager) | exact iff the second state was computed after the first |
| evict | store (+ manager) | lineage kept, so the state can be rebuilt; pinned blocks refused |
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from graphflow.kv.block import KVBlock
from graphflow.kv.codec import from_wire, to_wire
from graphflow.kv.manager import AdmitEvent, EvictEvent, KVStateManager, StateRecord, batch_from_blocks
from graphflow.kv.packing import cache_to_blocks
from graphflow.kv.prefiller import Prefiller
from graphflow.kv.rope import rerotate_keys
from graphflow.kv.state import KVState, Lineage
from graphflow.kv.store import BlockStore
from transport.base import TransferSpec, TransferStats, Transport

__all__ = ["MergeResult", "evict", "fork", "materialize", "merge", "transfer"]


def _report(
    manager: KVStateManager | None,
    store: BlockStore,
    state: KVState,
    tokens: list[int],
    now_s: float,
    new: list[KVBlock],
) -> None:
    if manager is not None:
        batch = batch_from_blocks(new, store.placement.replica, state.state_id)
        manager.apply([AdmitEvent(store.placement.replica, StateRecord.of(state, tokens), batch)], now_s)


def materialize(
    engine: Prefiller,
    store: BlockStore,
    token_ids: list[int],
    *,
    state_id: str | None = None,
    manager: KVStateManager | None = None,
    now_s: float = 0.0,
) -> KVState | None:
    """Prefill ``token_ids`` once, store the blocks and register the state.

    Returns ``None`` (nothing stored) when the blocks do not fit in the store.
    """
    pre = engine.prefill(token_ids)
    blocks = cache_to_blocks(pre.cache, token_ids, engine.identity, store.block_tokens)
    new = [b for b in blocks if not store.has_block(b.key)]
    state = store.add_state(blocks, Lineage("materialize"), state_id)
    if state is not None:
        _report(manager, store, state, list(token_ids), now_s, new)
    return state


def transfer(
    state_id: str,
    src: BlockStore,
    dst: BlockStore,
    sender: Transport,
    receiver: Transport,
    *,
    transfer_id: int = 1,
    token_ids: list[int] | None = None,
    manager: KVStateManager | None = None,
    now_s: float = 0.0,
) -> tuple[KVState | None, TransferStats | None]:
    """Copy a state from ``src`` to ``dst`` over a transport pair in this process.

    Only blocks ``dst`` lacks travel. Returns the new state on ``dst`` (``None`` if it does
    not fit) and the transfer's stats (``None`` when nothing had to move). Cross-process
    transfers run the same two halves in two processes (see ``graphflow.checks.transfer``).
    """
    blocks = src.blocks(state_id)
    missing = [b for b in blocks if not dst.has_block(b.key)]
    stats = None
    received: dict[int, KVBlock] = {}
    if missing:
        headers, tensors = to_wire(missing)
        box: dict[str, BaseException] = {}

        def send() -> None:
            try:
                sender.send(TransferSpec.for_headers(transfer_id, receiver.address, headers), headers, tensors)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                box["error"] = exc

        thread = threading.Thread(target=send)
        thread.start()
        try:
            got = receiver.recv(TransferSpec.for_headers(transfer_id, sender.address, headers))
        finally:
            thread.join()
        if "error" in box:
            raise box["error"]
        received = {b.key: b for b in from_wire(got.headers, got.tensors)}
        stats = got.stats
    chain = [received.get(b.key, b) for b in blocks]
    state = dst.add_state(chain, Lineage("transfer", ()), None)
    if state is not None:
        _report(manager, dst, state, token_ids or [], now_s, list(received.values()))
    return state, stats


def fork(
    store: BlockStore,
    state_id: str,
    k: int,
    *,
    manager: KVStateManager | None = None,
    token_ids: list[int] | None = None,
    now_s: float = 0.0,
) -> list[KVState]:
    """``k`` children sharing every block of ``state_id`` (copy-on-write on append)."""
    children = store.fork(state_id, k)
    for child in children:
        _report(manager, store, child, token_ids or [], now_s, [])
    return children


@dataclass(frozen=True, slots=True)
class MergeResult:
    state: KVState
    exact: bool
    rerotated_tokens: int


def merge(
    store: BlockStore,
    first: str,
    second: str,
    second_tokens: list[int],
    skip: int,
) -> MergeResult | None:
    """Restricted merge: ``first`` followed by ``second``'s tokens ``[skip, end)``.

    Exact (no new bytes) when ``second`` was computed after ``first`` — its chain starts with
    all of ``first``'s blocks and ``skip`` equals ``first``'s length. Otherwise the segment's
    keys are RoPE re-rotated from position ``skip`` to ``first``'s end and appended to a fork
    of ``first``: its tokens never attended to ``first``, so the result is *approximate*.
    Returns ``None`` when the copied segment does not fit.
    """
    a, b = store.state(first), store.state(second)
    if not 0 <= skip <= b.num_tokens:
        raise ValueError(f"skip must lie in [0, {b.num_tokens}], got {skip}")
    if len(second_tokens) != b.num_tokens:
        raise ValueError(f"second state has {b.num_tokens} tokens but {len(second_tokens)} token ids were given")
    if skip == a.num_tokens and b.block_keys[: len(a.block_keys)] == a.block_keys:
        (child,) = store.fork(second, 1)
        return MergeResult(child, True, 0)
    segment = torch.cat([blk.tensor for blk in store.blocks(second)], dim=3)[:, :, :, skip:]
    keys = rerotate_keys(segment[:, 0], a.num_tokens - skip, store.identity.rope)
    kv = torch.stack((keys, segment[:, 1]), dim=1)
    (child,) = store.fork(first, 1)
    grown = store.append(child.state_id, second_tokens[skip:], kv)
    if grown is None:
        store.release(child.state_id)
        return None
    return MergeResult(grown, False, b.num_tokens - skip)


def evict(store: BlockStore, state_id: str, *, manager: KVStateManager | None = None) -> int:
    """Release a state; blocks no other state uses are freed and reported. Returns bytes freed.

    Raises ``ValueError`` if the manager has any of the freed blocks pinned on this replica.
    """
    keys = store.state(state_id).block_keys
    freeing = tuple(k for k in keys if store.refcount(k) == 1)
    if manager is not None:
        manager.apply([EvictEvent(store.placement.replica, freeing, state_id)], 0.0)
    return store.release(state_id)
