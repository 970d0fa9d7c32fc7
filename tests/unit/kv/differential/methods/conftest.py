from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from graphflow.kv.differential.base import base_kv, template_kv
from graphflow.kv.differential.codecs import ResidualCodec
from graphflow.kv.differential.paths import PathKey
from graphflow.kv.differential.store import DifferentialKV
from graphflow.kv.packing import stack_cache
from graphflow.models import prompt_token_ids

KEY = PathKey(("SOLVE",), "REVIEW")


@dataclass
class Case:
    engine: object
    prefix: list[int]
    template: list[int]
    prefix_kv: torch.Tensor
    exact: torch.Tensor
    store: DifferentialKV


def make_case(e, codec: ResidualCodec | None = None) -> Case:
    prefix = prompt_token_ids(e.tokenizer, 40)
    tmpl = e.tokenizer.encode("\n### Step: review\nCheck every step of the work above, then answer.\n")
    out = e.prefill(prefix)
    prefix_kv = stack_cache(out.cache, 0, len(prefix)).clone()
    store = DifferentialKV(e.identity.model_key, e.identity.rope, codec or ResidualCodec())
    store.add_base(KEY.op, tmpl, base_kv(e, tmpl))
    return Case(e, prefix, tmpl, prefix_kv, template_kv(e, tmpl, prefix), store)


@pytest.fixture
def case(tiny_qwen_engine) -> Case:
    return make_case(tiny_qwen_engine)
