"""Tokenizers behind one small protocol: real HF tokenizers and a byte tokenizer for random models."""

from __future__ import annotations

from typing import Any, Protocol

import xxhash

__all__ = ["ByteTokenizer", "HFTokenizer", "Tokenizer"]


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def fingerprint(self) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes shifted by 3 (0 = pad, 1 = bos, 2 = eos): for randomly initialised models."""

    OFFSET = 3
    name = "bytes-v1"
    vocab_size = 256 + OFFSET
    eos_token_id: int | None = 2

    def encode(self, text: str) -> list[int]:
        return [b + self.OFFSET for b in text.encode()]

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t - self.OFFSET for t in token_ids if self.OFFSET <= t < 256 + self.OFFSET).decode(
            errors="replace"
        )

    def fingerprint(self) -> str:
        return self.name


class HFTokenizer:
    """Adapter over a transformers tokenizer."""

    def __init__(self, tokenizer: Any, name: str) -> None:
        self._tok = tokenizer
        self.name = name
        self.vocab_size = len(tokenizer)
        self.eos_token_id = tokenizer.eos_token_id

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tok.decode(token_ids))

    def fingerprint(self) -> str:
        vocab = sorted(self._tok.get_vocab().items())
        return f"{self.name}:{xxhash.xxh64_hexdigest(repr(vocab).encode())}"
