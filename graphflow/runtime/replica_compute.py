"""How a replica computes a node's tokens: through its engine loop when there is one, else on
the calling thread; with a template in a non-exact KV mode, through the template KV (rebuilt
from base + residual when the plan says RECONSTRUCT, else computed exactly and learned from);
and how what it computed becomes blocks to store (:meth:`NodeCompute.blocks_of`).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from graphflow.kv.block import KVBlock, make_blocks_from_layers
from graphflow.kv.differential.paths import PathKey
from graphflow.kv.differential.template_kv import TemplateKV
from graphflow.kv.keys import ROOT_KEY
from graphflow.kv.packing import blocks_to_cache, cache_to_blocks, layer_views
from graphflow.models.engine import Engine
from graphflow.runtime.batcher import Batcher
from graphflow.runtime.plan import NodePlan
from scheduler.policy import Option

__all__ = ["NodeCompute"]


class NodeCompute:
    """Prefill and decode for one replica's nodes.

    Args:
        engine: the replica's model.
        batcher: its engine loop (``None``: batching off, each call computes on its thread).
        templates: its template KV (``None`` in the exact mode).
        lock: the replica's store lock, held around the shared template store.
        block_tokens: tokens per stored block.
    """

    def __init__(
        self,
        engine: Engine,
        batcher: Batcher | None,
        templates: TemplateKV | None,
        lock: threading.RLock,
        block_tokens: int,
    ) -> None:
        self.engine = engine
        self.batcher = batcher
        self.templates = templates
        self.lock = lock
        self.block_tokens = block_tokens

    def cache_of(self, blocks: list[KVBlock]) -> Any:
        """A private cache holding ``blocks`` (verified already), or ``None`` for no blocks."""
        if not blocks:
            return None
        return blocks_to_cache(blocks, self.engine.identity, self.engine.config, self.engine.device, verify_bytes=False)

    def templated(self, plan: NodePlan, ids: list[int], cached: int) -> bool:
        """Whether the node's template goes through the template KV (rebuilt or learned)."""
        tmpl = plan.template
        start = len(ids) - (tmpl.tokens if tmpl else 0)
        return not (
            self.templates is None or tmpl is None or not tmpl.op or tmpl.tokens < 2 or start <= 0 or cached > start
        )

    def forward(self, tokens: list[int], cache: Any) -> tuple[int, Any]:
        """Run ``tokens`` after ``cache`` (a new one when ``None``); returns the greedy next
        token and the grown cache. Through the engine loop when there is one."""
        if self.batcher is not None:
            cache = cache if cache is not None else self.engine.new_cache()
            return self.batcher.generate(tokens, cache)[0], cache
        pre = self.engine.prefill(tokens, cache)
        return int(torch.argmax(pre.logits)), pre.cache

    def decode(self, cache: Any, first: int, steps: int) -> list[int]:
        """``steps`` greedy tokens after ``first`` (through the engine loop when there is one)."""
        if steps <= 0:
            return []
        if self.batcher is not None:
            return self.batcher.generate([first], cache, max_new=steps)
        return list(self.engine.decode_greedy(cache, first, steps).token_ids)

    def prefill(self, plan: NodePlan, ids: list[int], cached: int, cache: Any) -> tuple[int, Any, int, str]:
        """Prefill ``ids[cached:]`` on ``cache``. With a template and a non-exact mode, the
        template is rebuilt from base (+ residual) when the plan says RECONSTRUCT, else computed
        exactly (and learned from). Returns (first token, cache, rebuilt tokens, a note or "")."""
        if not self.templated(plan, ids, cached):
            note = "no template to rebuild; prefilled it" if plan.option is Option.RECONSTRUCT else ""
            return *self.forward(ids[cached:], cache), 0, note
        assert self.templates is not None and plan.template is not None
        tmpl = plan.template
        start = len(ids) - tmpl.tokens
        key, template = PathKey(tmpl.path, tmpl.op), ids[start:]
        with self.lock:  # NOTE: a replica runs several nodes at once; the template store is shared
            self.templates.prepare(key, template)
        prefix = self.forward(ids[cached:start], cache)[1] if start > cached else cache
        if plan.option is Option.RECONSTRUCT:
            rebuilt = self.templates.rebuild(prefix, start, key, template)
            if rebuilt is not None:
                return *self.forward(ids[-1:], rebuilt), tmpl.tokens - 1, ""
        note = (
            "the planned base + residual is gone; prefilled the template" if plan.option is Option.RECONSTRUCT else ""
        )
        first, full = self.forward(template, prefix)
        with self.lock:
            self.templates.learn(key, full, start, tmpl.tokens)
        return first, full, 0, note

    def blocks_of(self, state_tokens: list[int], cache: Any, prefix: list[KVBlock]) -> list[KVBlock]:
        """The blocks of ``state_tokens``: ``prefix`` (stored blocks) plus ``cache`` cut into blocks
        (``cache`` holds the tokens after the prefix, or all of them when there is none)."""
        from graphflow.models.row_cache import RowCache  # NOTE: here, or the client would import transformers

        bt, model_key = self.block_tokens, self.engine.identity.model_key
        at = len(prefix) * bt
        if isinstance(cache, RowCache):  # the engine loop's: it becomes the blocks (RowCache.into_blocks)
            parent = prefix[-1].key if prefix else ROOT_KEY
            return prefix + cache.into_blocks(state_tokens[at:], at, parent, model_key, bt)
        if not prefix:
            return cache_to_blocks(cache, state_tokens, self.engine.identity, bt)
        tail = make_blocks_from_layers(prefix[-1].key, state_tokens[at:], at, layer_views(cache), model_key, bt)
        return prefix + tail
