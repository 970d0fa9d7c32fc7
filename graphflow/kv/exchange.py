"""Moving a chain of KV blocks between two transport endpoints: the receiver derives what it
expects from the tokens alone, the sender puts the blocks on the wire.

```
tokens [0 ─────────── lo ────────────── hi)        chain keys of tokens[:hi]
                       └─ blocks lo/bt … hi/bt ─┘   travel (the receiver holds [0, lo) itself)
```

Used by the serving replicas (``runtime.replica``), the ``transfer`` operator, and the
two-process checks. Both sides know the tokens, so the receiver computes block keys and byte
sizes itself and refuses anything else the sender might put on the wire.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graphflow.kv.block import KVBlock
from graphflow.kv.codec import from_wire, to_wire
from graphflow.kv.keys import chain_keys
from graphflow.kv.state import ModelIdentity
from transport.base import TransferSpec, TransferStats, Transport

__all__ = ["receive_blocks", "send_blocks", "spec_for_prompt"]


def spec_for_prompt(
    identity: ModelIdentity, ids: Sequence[int], block_tokens: int, peer: str, transfer_id: int, first_token: int = 0
) -> TransferSpec:
    """The spec of the blocks covering ``ids[first_token:]`` in the hash chain of ``ids``.

    ``first_token`` must start a block (the receiver holds every earlier block itself)."""
    if first_token % block_tokens or not 0 <= first_token <= len(ids):
        raise ValueError(f"first_token must be a multiple of {block_tokens} in [0, {len(ids)}], got {first_token}")
    keys = chain_keys(list(ids), identity.model_key, block_tokens)[first_token // block_tokens :]
    per_token = identity.layout.bytes_per_token(getattr(torch, identity.layout.dtype).itemsize)
    sizes = [per_token * min(block_tokens, len(ids) - lo) for lo in range(first_token, len(ids), block_tokens)]
    return TransferSpec(transfer_id, peer, tuple(keys), tuple(sizes))


def send_blocks(transport: Transport, blocks: Sequence[KVBlock], peer: str, transfer_id: int) -> TransferStats:
    """Send ``blocks`` (device blocks go through host memory) to ``peer``; blocks until done."""
    headers, tensors = to_wire(blocks)
    return transport.send(TransferSpec.for_headers(transfer_id, peer, headers), headers, tensors)


def receive_blocks(transport: Transport, spec: TransferSpec) -> tuple[list[KVBlock], TransferStats]:
    """Receive what ``spec`` names (checksums verified by the transport) as host blocks."""
    got = transport.recv(spec)
    return from_wire(got.headers, got.tensors), got.stats
