from __future__ import annotations

import itertools

import pytest
import torch

from graphflow.kv.packing import stack_cache
from graphflow.models import Engine, prompt_token_ids
from graphflow.models.linear_kernel import OneDnnLinear, onednn_unsupported, use_linear_kernel
from graphflow.models.loading import weights_digest
from graphflow.models.ragged import Row, forward_rows

TOL = 1e-5  # fp32 logits of the tiny models: the two kernels only sum the products in another order

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen2"])
def pair(request):
    """The same model twice: on torch's kernel and on oneDNN's."""
    return Engine.load(request.param, linear_kernel="torch"), Engine.load(request.param, linear_kernel="onednn")


def test_a_onednn_linear_computes_what_the_linear_does():
    torch.manual_seed(0)
    for bias in (True, False):
        linear = torch.nn.Linear(64, 96, bias=bias)
        converted = OneDnnLinear(linear)
        for x in (torch.randn(5, 64), torch.randn(1, 7, 64), torch.randn(1, 64, 7).transpose(1, 2)):  # last: strided
            with torch.inference_mode():
                assert torch.allclose(converted(x), linear(x), atol=1e-5)


def test_every_linear_is_converted_over_its_own_weights(pair):
    plain, onednn = pair
    assert (plain.linear_kernel, onednn.linear_kernel) == ("torch", "onednn")
    assert not any(isinstance(m, torch.nn.Linear) for m in onednn.model.modules())
    assert not any(isinstance(m, OneDnnLinear) for m in plain.model.modules())
    head, embedding = onednn.model.lm_head, onednn.model.model.embed_tokens
    assert isinstance(head, OneDnnLinear)
    if onednn.model.config.tie_word_embeddings:  # nothing copied: a tied head still reads the embedding
        assert head.weight is embedding.weight


def test_either_kernel_computes_the_same_model_and_its_kv_is_the_same_models(pair):
    plain, onednn = pair
    assert plain.identity == onednn.identity  # KV computed on one is reused on the other
    assert weights_digest(onednn.model) == weights_digest(plain.model)  # the parameters are untouched
    prompt = prompt_token_ids(plain.tokenizer, 40)
    a, b = plain.prefill(prompt), onednn.prefill(prompt)
    assert torch.allclose(a.logits, b.logits, atol=TOL)
    assert torch.allclose(stack_cache(a.cache), stack_cache(b.cache), atol=TOL)
    first = int(a.logits.argmax())
    assert plain.decode_greedy(a.cache, first, 8).token_ids == onednn.decode_greedy(b.cache, first, 8).token_ids


def test_packed_rows_on_onednn_get_what_each_gets_alone(pair):
    _, engine = pair
    prompts = [prompt_token_ids(engine.tokenizer, n) for n in (37, 5, 64)]
    alone = [engine.prefill(p) for p in prompts]
    logits = forward_rows(engine.model, [Row(p, engine.new_cache()) for p in prompts])
    for a, got in zip(alone, logits, strict=True):
        assert torch.allclose(got, a.logits, atol=TOL) and int(got.argmax()) == int(a.logits.argmax())


def _clock(plain_s: float, onednn_s: float):
    """A clock under which every timed call of torch's MLP takes ``plain_s`` and oneDNN's ``onednn_s``
    (the choice times them alternately, torch's first)."""
    now = 0.0
    steps = itertools.cycle([0.0, plain_s, 0.0, onednn_s])

    def clock() -> float:
        nonlocal now
        now += next(steps)
        return now

    return clock


@pytest.mark.parametrize(("onednn_s", "kept"), [(0.5, "onednn"), (0.8, "onednn"), (0.9, "torch"), (1.5, "torch")])
def test_auto_keeps_onednn_only_where_it_measured_clearly_faster(onednn_s, kept):
    engine = Engine.load("tiny-llama", linear_kernel="torch")
    assert use_linear_kernel(engine.model, "auto", clock=_clock(1.0, onednn_s)) == kept
    assert isinstance(engine.model.model.layers[0].mlp.up_proj, OneDnnLinear) == (kept == "onednn")


def test_models_onednn_cannot_run_are_refused_or_left_alone():
    bf16 = Engine.load("tiny-llama", dtype="bfloat16", linear_kernel="torch")
    assert "float32" in onednn_unsupported(bf16.model)
    with pytest.raises(ValueError, match="cannot run the linear layers on oneDNN: .*bfloat16"):
        use_linear_kernel(bf16.model, "onednn")
    assert use_linear_kernel(bf16.model, "auto") == "torch"
    with pytest.raises(ValueError, match="unknown linear kernel 'mkl'; use one of auto, torch, onednn"):
        Engine.load("tiny-llama", linear_kernel="mkl")
