"""Scoring one template-KV method on one exact execution: what users feel.

* teacher-forced next-token agreement and mean KL(exact ‖ method) over the node's generated
  tokens, the template's KV given by the method for all but its last token;
* whether greedy decoding from the method's KV reproduces the node's exact output;
* the template's time to first token: from the prefix KV to the first output's logits (the
  method's rebuild, then the last template token's forward), against a full template prefill
  after the same prefix (:func:`full_prefill_s`), on the same node in the same run.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from experiments.kv_memory.execute import Execution
from graphflow.kv.differential.methods import TemplateMethod
from graphflow.kv.packing import cache_from_tensor
from graphflow.models.engine import Engine

__all__ = ["full_prefill_s", "kl_and_agreement", "score", "teacher_forced"]


def kl_and_agreement(ref_logits: torch.Tensor, logits: torch.Tensor) -> tuple[float, float]:
    ref, got = torch.log_softmax(ref_logits, -1), torch.log_softmax(logits, -1)
    kl = float((ref.exp() * (ref - got)).sum(-1).mean())
    agree = float((ref_logits.argmax(-1) == logits.argmax(-1)).float().mean())
    return agree, kl


def _cache(engine: Engine, prefix_kv: torch.Tensor, template_kv: torch.Tensor, tokens: int) -> Any:
    """A cache of the prefix and the template's first ``tokens`` tokens."""
    body = template_kv[:, :, :, :tokens].to(prefix_kv.dtype)
    return cache_from_tensor(torch.cat((prefix_kv, body), dim=3), engine.config, prefix_kv.device)


@torch.inference_mode()
def teacher_forced(engine: Engine, ex: Execution, template_kv: torch.Tensor) -> torch.Tensor:
    """Logits predicting each of ``ex``'s generated tokens, the template's KV given by
    ``template_kv`` for all but its last token (which is run, then the generated tokens)."""
    n = len(ex.template)
    ids = torch.tensor([[ex.template[-1], *ex.generated[:-1]]], dtype=torch.long, device=engine.device)
    return (
        engine.model(input_ids=ids, cache=_cache(engine, ex.prefix_kv, template_kv, n - 1), use_cache=True)
        .logits[0]
        .float()
    )


@torch.inference_mode()
def full_prefill_s(engine: Engine, ex: Execution) -> float:
    """Seconds from the prefix KV to the first output's logits with the template prefilled."""
    start = time.perf_counter()
    engine.prefill(ex.template, cache_from_tensor(ex.prefix_kv, engine.config, ex.prefix_kv.device))
    return time.perf_counter() - start


@torch.inference_mode()
def score(engine: Engine, method: TemplateMethod, ex: Execution, greedy: bool = True) -> dict[str, Any] | None:
    """One row for ``method`` on ``ex`` (``None`` when the method has nothing for its template);
    ``greedy=False`` skips the greedy-identity decode and the time to first token."""
    start = time.perf_counter()
    rebuilt = method.rebuild(engine, ex.key, ex.prefix_kv, ex.template)
    if rebuilt is None:
        return None
    n = len(ex.template)
    row: dict[str, Any] = {
        "recomputed": rebuilt.recomputed,
        "recompute_fraction": rebuilt.recompute_fraction,
        "ttft_s": None,
        "identical_output": None,
    }
    if greedy:
        first = engine.prefill([ex.template[-1]], _cache(engine, ex.prefix_kv, rebuilt.kv, n - 1))
        row["ttft_s"] = time.perf_counter() - start
        token = int(first.logits.argmax())
        steps = len(ex.generated) - 1
        rest = engine.decode_greedy(first.cache, token, steps).token_ids if steps else ()
        row["identical_output"] = [token, *rest] == ex.generated
    agree, kl = kl_and_agreement(ex.ref_logits, teacher_forced(engine, ex, rebuilt.kv))
    row.update(agreement=agree, kl=kl)
    return row
