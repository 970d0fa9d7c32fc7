"""Exact executions of planned workflows, node by node, as the executor lays prompts out
(``graphflow.workflow.compile.node_context``): each node's prefix is prefilled, then its
template, and it greedily decodes ``decode`` tokens that later nodes read. What a node leaves
for scoring is an :class:`Execution`: its prefix KV, its exact template KV, the tokens it
generated and the logits that chose them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from graphflow.kv.differential.paths import PathKey
from graphflow.kv.packing import stack_cache
from graphflow.models.engine import Engine
from graphflow.workflow.compile import ROOT, ExecGraph, node_context, node_path

__all__ = ["Execution", "execute_workflow"]


@dataclass(frozen=True, slots=True, eq=False)
class Execution:
    workflow: int
    node: str
    key: PathKey
    template: list[int]
    prefix_kv: torch.Tensor  # [L, 2, H, prefix, D]
    exact: torch.Tensor  # the template's exact KV after the prefix, [L, 2, H, n, D]
    generated: list[int]  # the node's greedy output (the template's last logits, then each decode step)
    ref_logits: torch.Tensor  # [len(generated), vocab], the logits that chose each generated token

    @property
    def offset(self) -> int:
        return int(self.prefix_kv.shape[3])


@torch.inference_mode()
def execute_workflow(
    engine: Engine,
    workflow: int,
    gs: ExecGraph,
    task_ids: list[int],
    encode: Callable[[str], list[int]],
    decode: int,
) -> Iterator[Execution]:
    """Run ``gs`` exactly, yielding each node's execution in topological order."""
    contexts: dict[str, list[int]] = {ROOT: task_ids}
    outputs: dict[str, list[int]] = {}
    for node in gs.nodes:
        ctx = node_context(node, contexts, outputs, task_ids, encode)
        tmpl = encode(node.template)
        prefix = ctx[: len(ctx) - len(tmpl)]
        pre = engine.prefill(prefix)
        prefix_kv = stack_cache(pre.cache, 0, len(prefix)).clone()
        out = engine.prefill(tmpl, pre.cache)
        exact = stack_cache(out.cache, len(prefix))
        first = int(out.logits.argmax())
        dec = engine.decode_greedy(out.cache, first, decode - 1) if decode > 1 else None
        generated = [first, *(dec.token_ids if dec else ())]
        ref_logits = torch.cat((out.logits[None], dec.logits)) if dec else out.logits[None]
        contexts[node.id], outputs[node.id] = ctx, generated
        key = PathKey(node_path(gs, node.id), node.role)
        yield Execution(workflow, node.id, key, tmpl, prefix_kv, exact, generated, ref_logits)
