from __future__ import annotations

import pytest
import torch

from graphflow.kv.differential.base import base_kv, template_kv
from graphflow.kv.differential.codecs import ResidualCodec, apply_residual, frame0_residual
from graphflow.kv.differential.modes import KVMode
from graphflow.kv.differential.paths import PathKey, PathStats
from graphflow.kv.differential.store import DifferentialKV, Residual
from graphflow.kv.errors import IncompatibleState
from graphflow.models import prompt_token_ids


@pytest.fixture(scope="module")
def kvs(tiny_qwen_engine):
    e = tiny_qwen_engine
    tmpl = e.tokenizer.encode("\n### Step: review\nCheck it.\n")
    prefixes = [prompt_token_ids(e.tokenizer, n) for n in (30, 47)]
    return e, tmpl, base_kv(e, tmpl), [(len(p), template_kv(e, tmpl, p)) for p in prefixes]


def test_frame0_residual_rebuilds_the_exact_kv_at_its_offset(kvs):
    e, _, base, [(off, exact), _] = kvs
    delta = frame0_residual(exact, base, off, e.identity.rope)
    rebuilt = apply_residual(base, ResidualCodec().encode(delta), off, e.identity.rope)
    # float16 storage of Δ₀ is the only loss: float rounding of the residual's magnitude
    assert (rebuilt - exact).abs().max() <= 1e-3 * max(1.0, float(delta.abs().max()))
    exact_f32 = apply_residual(base + delta, None, off, e.identity.rope)
    assert torch.allclose(exact_f32, exact, atol=1e-5)  # unquantized Δ₀: exact to float32 rounding


def test_codec_byte_accounting_and_sink_rows():
    delta = torch.randn(2, 2, 3, 10, 16)
    top = ResidualCodec(keep_per_row=4, sink_tokens=2).encode(delta)
    rows_rest, rows_sink = 2 * 2 * 3 * 8, 2 * 2 * 3 * 2
    assert top.nbytes == rows_sink * 16 * 2 + rows_rest * 4 * (2 + 1)  # sink fp16 + values fp16 + uint8 indices
    d = top.dense()
    assert torch.allclose(d[:, :, :, :2], delta[:, :, :, :2], atol=1e-2)  # the sink is kept dense
    assert int((d[:, :, :, 2:] != 0).sum(-1).max()) == 4
    kept = torch.topk(delta[:, :, :, 2:].abs(), 4, dim=-1).values
    assert torch.allclose(d[:, :, :, 2:].abs().topk(4, dim=-1).values, kept, atol=1e-2)
    assert ResidualCodec().encode(delta).nbytes == delta.numel() * 2
    with pytest.raises(ValueError, match="keep_per_row"):
        ResidualCodec(keep_per_row=0)


def test_codec_stores_nothing_for_recomputed_head_tokens():
    delta = torch.randn(2, 2, 3, 10, 16)
    codec = ResidualCodec(recompute_head=4)
    enc = codec.encode(delta)
    assert enc.nbytes == 2 * 2 * 3 * 6 * 16 * 2  # fp16, the 6 tokens after the head
    d = enc.dense()
    assert d.shape == delta.shape and not d[:, :, :, :4].any()
    assert torch.allclose(d[:, :, :, 4:], delta[:, :, :, 4:], atol=1e-2)
    sparse = ResidualCodec(keep_per_row=4, sink_tokens=2, recompute_head=3).encode(delta)
    assert sparse.nbytes == 2 * 2 * 3 * (2 * 16 * 2 + 5 * 4 * 3)
    assert codec.label == "dense, first 4 recomputed"
    assert ResidualCodec(recompute_head=50).encode(delta).nbytes == 0
    with pytest.raises(ValueError, match="recompute_head"):
        ResidualCodec(recompute_head=-1)


def test_pruning_keeps_exactly_the_hot_paths():
    a, b, c = PathKey((), "solve"), PathKey(("solve",), "review"), PathKey(("solve", "review"), "final")
    stats = PathStats()
    for keys in ([a, b], [a, b, c], [a], [a, b]):
        stats.observe(keys)
    assert stats.hot(min_count=3) == {a, b}
    assert stats.hot(min_count=1) == {a, b, c}
    assert stats.hot(top_k=1) == {a}
    with pytest.raises(ValueError, match="exactly one"):
        stats.hot()


def test_store_modes_pruning_and_refusals(kvs):
    e, tmpl, base, [(off1, ex1), (off2, ex2)] = kvs
    hot, cold = PathKey((), "review"), PathKey(("x",), "review")
    store = DifferentialKV(e.identity.model_key, e.identity.rope, ResidualCodec(), hot={hot})
    store.add_base("review", tmpl, base)
    assert store.observe(cold, ex1, off1) is None and not store.residuals  # pruned: never learned
    res = store.observe(hot, ex1, off1)
    assert res is not None and res.executions == 1 and store.nbytes()["residual"] == res.encoded.nbytes
    assert store.template_kv(hot, off2, KVMode.EXACT) is None
    assert store.template_kv(cold, off2, KVMode.DIFFERENTIAL) is None  # cold path → recompute
    diff = store.template_kv(hot, off2, KVMode.DIFFERENTIAL)
    stateless = store.template_kv(cold, off2, KVMode.STATELESS)
    assert diff is not None and stateless is not None
    assert (diff - ex2).norm() < (stateless - ex2).norm()  # the shared residual helps another execution
    other = Residual(hot, "other-model@123", res.base_version, res.encoded, 1)
    with pytest.raises(IncompatibleState, match="other-model"):
        store.add_residual(other)
    stale = Residual(hot, res.model_key, "0" * 16, res.encoded, 1)
    with pytest.raises(IncompatibleState, match="another version"):
        store.add_residual(stale)
    assert store.residuals[hot] is res  # refusals change nothing
    store.add_base("review", tmpl[:-1], base[:, :, :, :-1])  # a new template version drops old residuals
    assert not store.residuals


def test_residuals_average_reference_executions(kvs):
    e, tmpl, base, [(off1, ex1), (off2, ex2)] = kvs
    key = PathKey((), "review")
    store = DifferentialKV(e.identity.model_key, e.identity.rope, ResidualCodec(), reference_executions=2)
    store.add_base("review", tmpl, base)
    assert store.observe(key, ex1, off1) is None
    res = store.observe(key, ex2, off2)
    assert res is not None and res.executions == 2 and not store.wants(key)
    mean = (frame0_residual(ex1, base, off1, e.identity.rope) + frame0_residual(ex2, base, off2, e.identity.rope)) / 2
    assert torch.allclose(res.encoded.dense(), mean, atol=1e-2)
