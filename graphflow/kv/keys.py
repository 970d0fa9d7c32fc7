"""Block keys, without torch (the manager, its catalog and the planner use them).

Block keys form a hash chain, as in vLLM's prefix caching and LMCache:

```
key_0 = xxh64(ROOT_KEY  | model_key | tokens[0:T])
key_1 = xxh64(key_0     | model_key | tokens[T:2T])
...
```

so a key names a block's tokens *and everything before them* under one model config, and is
the same in every process. Only the last block of a sequence may be partial (< T tokens).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import xxhash

__all__ = ["ROOT_KEY", "block_key", "chain_keys"]

ROOT_KEY = 0
_U64 = struct.Struct("<Q")


def block_key(parent_key: int, token_ids: Sequence[int], model_key: str) -> int:
    """Deterministic 64-bit key of a block: ``xxh64(parent_key, model_key, token_ids)``."""
    h = xxhash.xxh64()
    h.update(_U64.pack(parent_key))
    encoded = model_key.encode()
    h.update(_U64.pack(len(encoded)))
    h.update(encoded)
    h.update(np.asarray(token_ids, dtype="<i4").tobytes())
    return h.intdigest()


def chain_keys(token_ids: Sequence[int], model_key: str, block_tokens: int, parent_key: int = ROOT_KEY) -> list[int]:
    """Keys of the blocks covering ``token_ids``, chained from ``parent_key``."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    keys: list[int] = []
    for start in range(0, len(token_ids), block_tokens):
        parent_key = block_key(parent_key, token_ids[start : start + block_tokens], model_key)
        keys.append(parent_key)
    return keys
