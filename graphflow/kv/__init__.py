"""KV state objects: blocks, states, packing to/from transformers caches, the block store."""

from graphflow.kv.block import ROOT_KEY, KVBlock, block_key, chain_keys, make_block
from graphflow.kv.codec import from_wire, load_blocks, save_blocks, to_wire
from graphflow.kv.errors import ChecksumMismatch, IncompatibleState
from graphflow.kv.packing import blocks_to_cache, cache_to_blocks, stack_cache, validate_chain
from graphflow.kv.state import (
    Compat,
    KVLayout,
    KVState,
    Lineage,
    ModelIdentity,
    Placement,
    Positions,
    RopeInfo,
    compat,
    require_compat,
)
from graphflow.kv.store import BlockStore, StoreStats

__all__ = [
    "ROOT_KEY",
    "BlockStore",
    "ChecksumMismatch",
    "Compat",
    "IncompatibleState",
    "KVBlock",
    "KVLayout",
    "KVState",
    "Lineage",
    "ModelIdentity",
    "Placement",
    "Positions",
    "RopeInfo",
    "StoreStats",
    "block_key",
    "blocks_to_cache",
    "cache_to_blocks",
    "chain_keys",
    "compat",
    "from_wire",
    "load_blocks",
    "save_blocks",
    "to_wire",
    "make_block",
    "require_compat",
    "stack_cache",
    "validate_chain",
]
