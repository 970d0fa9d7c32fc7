"""Fork check: one long shared context, many branches, memory = shared + private blocks.

```
materialize N tokens once ──► fork into k children ──► each child: its own suffix + decode
                                                        (new KV appended copy-on-write)
```

``measured_bytes`` is the BlockStore's real peak (bytes of the tensors it held);
``dense_bytes`` is what k independent copies hold: the sum, over branches, of the bytes of
every block in that branch's final state (shared blocks counted once per branch).
``ideal_ratio`` is the same quotient from token counts alone (shared tokens once, private
tokens per branch). Decoding runs on a working cache rebuilt from the shared blocks (transformers attends over a
contiguous cache); that transient engine memory is reported apart, as ``engine_cache_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from graphflow.kv.operators import fork, materialize
from graphflow.kv.packing import blocks_to_cache, cache_nbytes, stack_cache
from graphflow.kv.state import Placement
from graphflow.kv.store import BlockStore
from graphflow.models.engine import Engine
from graphflow.models.prompts import prompt_token_ids

__all__ = ["ForkCheck", "run_fork_check"]


@dataclass(frozen=True, slots=True)
class ForkCheck:
    model: str
    tokens: int
    branches: int
    decode_tokens: int
    shared_bytes: int
    private_bytes: int
    measured_bytes: int
    dense_bytes: int
    ratio_measured_to_dense: float
    ideal_ratio: float
    engine_cache_bytes: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def run_fork_check(
    model: str = "tiny-llama",
    tokens: int = 4096,
    branches: int = 16,
    decode_tokens: int = 32,
    say: Callable[[str], None] = lambda _m: None,
) -> ForkCheck:
    if min(tokens, branches, decode_tokens) <= 0:
        raise ValueError(
            f"tokens, branches and decode tokens must be positive, got {tokens}, {branches}, {decode_tokens}"
        )
    engine = Engine.load(model, say=say)
    store = BlockStore(engine.identity, capacity_bytes=1 << 40, placement=Placement("replica-0"))
    ids = prompt_token_ids(engine.tokenizer, tokens)
    say(f"materializing the shared {tokens}-token context")
    root = materialize(engine, store, ids, state_id="root")
    assert root is not None
    shared = store.used_bytes
    children = fork(store, "root", branches)
    engine_bytes, private_tokens = 0, 0
    for i, child in enumerate(children):
        say(f"branch {i + 1}/{branches}: suffix + {decode_tokens} decoded tokens")
        suffix = engine.tokenizer.encode(f"\nAgent {i + 1} of {branches}, your part:")
        cache = blocks_to_cache(store.blocks(child.state_id), engine.identity, engine.config)
        pre = engine.prefill(suffix, cache)
        out = engine.decode_greedy(pre.cache, int(torch.argmax(pre.logits)), decode_tokens)
        new_ids = suffix + [int(torch.argmax(pre.logits))] + list(out.token_ids[:-1])
        engine_bytes = max(engine_bytes, cache_nbytes(pre.cache))
        new_kv = stack_cache(pre.cache, tokens, tokens + len(new_ids))
        grown = store.append(child.state_id, new_ids, new_kv)
        assert grown is not None
        private_tokens += len(new_ids)
        store.check_integrity()
    measured = store.stats().peak_used_bytes
    dense = sum(sum(b.nbytes for b in store.blocks(c.state_id)) for c in children)
    private = measured - shared
    return ForkCheck(
        model=model,
        tokens=tokens,
        branches=branches,
        decode_tokens=decode_tokens,
        shared_bytes=shared,
        private_bytes=private,
        measured_bytes=measured,
        dense_bytes=dense,
        ratio_measured_to_dense=measured / dense,
        ideal_ratio=(tokens + private_tokens) * engine.kv_bytes_per_token() / dense,
        engine_cache_bytes=engine_bytes,
    )
