"""Build a model + tokenizer from a :class:`ModelSpec`, and its identity (M, Θ, RoPE, layout)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import xxhash

from graphflow.kv.state import KVLayout, ModelIdentity, RopeInfo
from graphflow.models.fetch import ensure_smollm2
from graphflow.models.registry import ModelSpec
from graphflow.models.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["LoadedModel", "load_model", "model_identity", "weights_digest"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_INIT_LOCK = threading.Lock()
# NOTE: transformers' lazily imported names are not safe to import from two threads at once: two
# threads loading a model at the same time failed one time in three here with "cannot import
# name 'LlamaConfig' from 'transformers'"; model loads import them under this lock.
_IMPORT_LOCK = threading.Lock()
_VOLATILE_CONFIG_KEYS = ("transformers_version", "_name_or_path", "name_or_path")


@dataclass(frozen=True, slots=True, eq=False)
class LoadedModel:
    spec: ModelSpec
    model: PreTrainedModel
    tokenizer: Tokenizer
    identity: ModelIdentity
    device: torch.device


def weights_digest(model: torch.nn.Module) -> str:
    """xxh3-64 over every parameter and buffer's bytes, in state-dict order."""
    h = xxhash.xxh3_64()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        t = tensor.detach().contiguous().cpu()
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _rope(config: Any) -> RopeInfo:
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = float(params.pop("rope_theta", getattr(config, "rope_theta", 10000.0)))
    return RopeInfo(theta=theta, scaling=json.dumps(params, sort_keys=True, default=str))


def model_identity(spec: ModelSpec, model: PreTrainedModel, tokenizer: Tokenizer) -> ModelIdentity:
    """Θ = hash(config, tokenizer, dtype, weights): equal only for the very same model."""
    config = model.config
    cfg = {k: v for k, v in config.to_dict().items() if k not in _VOLATILE_CONFIG_KEYS}
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    h = xxhash.xxh64()
    h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
    h.update(tokenizer.fingerprint().encode())
    h.update(dtype.encode())
    h.update(weights_digest(model).encode())
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layout = KVLayout(
        layers=config.num_hidden_layers,
        kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        head_dim=head_dim,
        dtype=dtype,
    )
    return ModelIdentity(model_id=spec.name, config_hash=h.hexdigest(), rope=_rope(config), layout=layout)


def _architecture(arch: str) -> tuple[Any, Any]:
    """The config and model classes of ``arch``, imported when a model is built: importing the
    model classes takes about 2 s here, which processes that only name a replica class (a Ray
    client attaching, Ray's client server) would otherwise pay."""
    with _IMPORT_LOCK:
        from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    return {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]


def _build_random(spec: ModelSpec, dtype: torch.dtype) -> PreTrainedModel:
    config_cls, model_cls = _architecture(spec.arch)
    kwargs = dict(spec.config)
    rope_theta = kwargs.pop("rope_theta", 10000.0)
    config = config_cls(**kwargs, rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    # NOTE: initialisation draws from torch's global RNG; the lock keeps two threads loading
    # models at once from interleaving draws (which would give each different weights).
    with _INIT_LOCK:
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(spec.seed)
            model = model_cls(config)
        finally:
            torch.random.set_rng_state(state)
    return model.to(dtype)


def load_model(
    spec: ModelSpec,
    device: str = "cpu",
    dtype: str | None = None,
    say: Callable[[str], None] = lambda _msg: None,
) -> LoadedModel:
    """Build or load ``spec`` on ``device`` (``dtype`` overrides the spec's default).

    Never contacts a model hub (``HF_HUB_OFFLINE`` is forced on while loading).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    dtype_name = dtype or spec.dtype
    if dtype_name not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype_name!r}; use one of {sorted(_DTYPES)}")
    torch_dtype = _DTYPES[dtype_name]
    tokenizer: Tokenizer
    if spec.source == "random":
        model = _build_random(spec, torch_dtype)
        tokenizer = ByteTokenizer()
    else:
        with _IMPORT_LOCK:
            from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = ensure_smollm2(say) if spec.source == "smollm2" else spec.path
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype)
        tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(str(folder)), name=spec.name)
    torch_device = torch.device(device)
    torch.nn.Module.to(model, torch_device)
    model.eval()
    return LoadedModel(spec, model, tokenizer, model_identity(spec, model, tokenizer), torch_device)
