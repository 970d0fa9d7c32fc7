"""A replica materializes a context by reusing what its store holds and prefilling the rest;
a context it holds whole runs no forward at all (no Ray)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch

from graphflow.runtime.replica import ReplicaWorker
from graphflow.runtime.replica_config import ReplicaConfig

_names = itertools.count()


@pytest.fixture
def worker() -> Iterator[ReplicaWorker]:
    w = ReplicaWorker(ReplicaConfig(f"mat-{next(_names)}", "tiny-llama", 1 << 24, transport="local"))
    try:
        yield w
    finally:
        w.close()


def _context(w: ReplicaWorker, n: int) -> list[int]:
    ids = w.encode("The context an upstream step computed: " + "a b c d e f g h. " * 20)[:n]
    assert len(ids) == n
    return ids


def test_a_context_held_whole_is_kept_again_without_a_forward(worker: ReplicaWorker) -> None:
    ids = _context(worker, 64)  # four whole blocks
    first = worker.materialize("upstream:ROOT", ids)
    steps, used = worker.stats().engine_steps, worker.stats().used_bytes
    again = worker.materialize("run:ROOT", ids)
    assert (first.reused, again.reused) == (0, 64)
    assert again.kept and worker.stats().states == 2
    assert worker.stats().engine_steps == steps  # nothing was run
    assert worker.stats().used_bytes == used  # the second state shares the first one's blocks


def test_a_context_held_in_part_prefills_only_its_tail(worker: ReplicaWorker) -> None:
    ids = _context(worker, 70)
    worker.materialize("upstream:ROOT", ids[:64])
    steps = worker.stats().engine_steps
    got = worker.materialize("run:ROOT", ids)
    assert got.reused == 64 and got.kept
    assert worker.stats().engine_steps == steps + 1  # one step over the six tokens left


def test_an_empty_context_is_refused(worker: ReplicaWorker) -> None:
    with pytest.raises(ValueError, match="task context is empty"):
        worker.materialize("empty:ROOT", [])
    assert worker.stats().states == 0


def test_a_context_held_nowhere_is_prefilled_into_a_room_that_becomes_its_blocks(
    worker: ReplicaWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphflow.kv.packing import cache_to_blocks
    from graphflow.models.row_cache import RowCache

    rooms: list[int] = []
    into_blocks = RowCache.into_blocks

    def spy(self: RowCache, *args: object, **kwargs: object) -> object:
        rooms.append(self.capacity)
        return into_blocks(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RowCache, "into_blocks", spy)
    ids = _context(worker, 70)  # four whole blocks and six tokens
    got = worker.materialize("upstream:ROOT", ids)
    assert got.reused == 0 and got.kept and worker.batcher is not None
    assert rooms == [70]  # a room of exactly the context, not a growing cache copied into blocks
    blocks = worker.store.blocks("upstream:ROOT")
    at = blocks[0].tensor.data_ptr()
    for block in blocks:  # one buffer of exactly the context's KV, block after block
        assert block.tensor.data_ptr() == at
        at += block.tensor.numel() * block.tensor.element_size()
    expected = cache_to_blocks(worker.engine.prefill(ids).cache, ids, worker.engine.identity, 16)
    assert [b.key for b in blocks] == [b.key for b in expected]
    for block, want in zip(blocks, expected, strict=True):
        assert torch.allclose(block.tensor, want.tensor, atol=1e-5)
