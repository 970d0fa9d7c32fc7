"""Differential template KV on a replica: serve an operation's template KV from its base and
a path's residual instead of prefilling it (DESIGN.md §2; ``graphflow.kv.differential.store``).

Per replica and model: one *base* per operation (its template's KV with no prefix, recomputed
if the template's tokens change), and, for each *hot* path key — seen at least ``min_count``
times on this replica — one residual averaged from that path's first ``refs`` exact
executions. Cold paths are pruned: they run exactly and store nothing. A run's ``mode``:

* ``exact`` — never approximate (the replica then holds no :class:`TemplateKV` at all);
* ``differential`` — base + residual where the path has one, with the codec's
  ``recompute_head`` first template tokens recomputed after the prefix; exact otherwise;
* ``stateless`` — base only (re-rotated), for every path.

A rebuilt template is approximate, so the replica never keeps the state it produced as a
reusable prefix (it would otherwise be served to later nodes as if it were exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from graphflow.kv.differential.base import base_kv
from graphflow.kv.differential.codecs import ResidualCodec
from graphflow.kv.differential.modes import KVMode, TemplateStats, base_version
from graphflow.kv.differential.paths import PathKey, PathStats
from graphflow.kv.differential.recompute import rebuild_template
from graphflow.kv.differential.store import DifferentialKV
from graphflow.kv.events import TemplateHolding
from graphflow.kv.packing import cache_from_tensor, stack_cache
from graphflow.kv.prefiller import Prefiller

__all__ = ["TemplateKV"]


class TemplateKV:
    def __init__(
        self, engine: Prefiller, mode: KVMode, codec: ResidualCodec | None = None, refs: int = 4, min_count: int = 2
    ) -> None:
        if mode is KVMode.EXACT:
            raise ValueError("exact mode never rebuilds a template; run without a TemplateKV")
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}")
        self.engine = engine
        self.mode = mode
        self.min_count = min_count
        self.stats = PathStats()
        self.store = DifferentialKV(
            engine.identity.model_key,
            engine.identity.rope,
            codec or ResidualCodec(),
            hot=set(),
            reference_executions=refs,
        )
        self.rebuilt = 0  # templates served from base (+ residual)
        self.learned = 0  # exact executions averaged into residuals

    def prepare(self, key: PathKey, template: Sequence[int]) -> None:
        """Count one execution of ``key`` and make sure ``key.op`` has a base for ``template``."""
        self.stats.observe([key])
        base = self.store.bases.get(key.op)
        if base is None or base.version != base_version(self.store.model_key, template):
            self.store.add_base(key.op, template, base_kv(self.engine, template))
        if self.stats.counts[key] >= self.min_count:
            assert self.store.hot is not None
            self.store.hot.add(key)

    def rebuild(self, prefix: Any, prefix_tokens: int, key: PathKey, template: Sequence[int]) -> Any | None:
        """A cache holding ``prefix`` (a cache of ``prefix_tokens`` tokens) and every template token
        but the last, rebuilt; ``None`` when the template must be computed exactly. The caller
        prefills the template's last token on it (which yields the first output's logits)."""
        prefix_kv = stack_cache(prefix, 0, prefix_tokens)
        kv = rebuild_template(self.engine, self.store, key, prefix_kv, template, self.mode)
        if kv is None:
            return None
        self.rebuilt += 1
        body = kv[:, :, :, : len(template) - 1].to(prefix_kv.dtype)
        return cache_from_tensor(torch.cat((prefix_kv, body), dim=3), self.engine.config, prefix_kv.device)

    def learn(self, key: PathKey, cache: Any, start: int, n: int) -> None:
        """Average an exact execution (the template's ``n`` tokens at ``start`` in ``cache``) into
        ``key``'s residual, while the path is hot and still learning."""
        if self.mode is KVMode.DIFFERENTIAL and self.store.wants(key):
            self.store.observe(key, stack_cache(cache, start, start + n), start)
            self.learned += 1

    def holdings(self) -> tuple[TemplateHolding, ...]:
        """What this replica can rebuild (reported to the KV manager, priced by the policy)."""
        out = []
        if self.mode is KVMode.STATELESS:
            out = [
                TemplateHolding(op, None, b.version, int(b.kv.shape[3]), b.nbytes) for op, b in self.store.bases.items()
            ]
        for key, res in self.store.residuals.items():
            n = int(self.store.bases[key.op].kv.shape[3])
            head = self.store.codec.head_tokens(n) if self.mode is KVMode.DIFFERENTIAL else 0
            out.append(TemplateHolding(key.op, key.path, res.base_version, n, res.encoded.nbytes, head))
        return tuple(out)

    def summary(self) -> TemplateStats:
        held = self.store.nbytes()
        return TemplateStats(
            self.mode.value,
            self.rebuilt,
            self.learned,
            len(self.store.residuals),
            len(self.store.hot or ()),
            held["base"],
            held["residual"],
        )
