"""KV state S = (M, Θ, B, Π, Λ, Γ) and the compatibility rule (AAFLOW+ eq. 10 and 13).

* M — ``model_id``: the registry name (or checkpoint path) of the model.
* Θ — ``config_hash``: hash of the model config, tokenizer identity, dtype and weights.
* B — ``block_keys``: ordered hash-chain keys of the state's blocks.
* Π — ``position``: offset of the first token, token count, RoPE base and scaling.
* Λ — ``lineage``: parent states and the operator that produced this one.
* Γ — ``placement``: replica, node and device holding the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from graphflow.kv.errors import IncompatibleState

__all__ = [
    "Compat",
    "KVLayout",
    "KVState",
    "Lineage",
    "ModelIdentity",
    "Placement",
    "Positions",
    "RopeInfo",
    "compat",
    "require_compat",
]


@dataclass(frozen=True, slots=True)
class RopeInfo:
    """Rotary position embedding parameters that K tensors were rotated with."""

    theta: float
    scaling: str = "default"  # rope_type plus its parameters, as canonical JSON


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Shape of one token's KV in a model: what a block tensor must match."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str

    def block_shape(self, tokens: int) -> tuple[int, int, int, int, int]:
        return (self.layers, 2, self.kv_heads, tokens, self.head_dim)

    def bytes_per_token(self, itemsize: int) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * itemsize


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """What a KV state must agree with to be reused by a model: M, Θ, RoPE and layout."""

    model_id: str
    config_hash: str
    rope: RopeInfo
    layout: KVLayout

    @property
    def model_key(self) -> str:
        """The string mixed into block keys, so blocks of different models never collide."""
        return f"{self.model_id}@{self.config_hash}"


@dataclass(frozen=True, slots=True)
class Positions:
    """Π: where the state's tokens sit and how K was rotated."""

    offset: int
    num_tokens: int
    rope: RopeInfo

    @property
    def end(self) -> int:
        return self.offset + self.num_tokens


@dataclass(frozen=True, slots=True)
class Lineage:
    """Λ: how the state came to be, enough to rebuild it."""

    operator: str
    parents: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """Γ: where the state's blocks live."""

    replica: str = "local"
    node: str = "localhost"
    device: str = "cpu"


@dataclass(frozen=True, slots=True)
class KVState:
    """A logical KV state: an ordered list of block keys plus everything needed to trust it."""

    state_id: str
    model_id: str
    config_hash: str
    block_keys: tuple[int, ...]
    position: Positions
    lineage: Lineage
    placement: Placement = field(default_factory=Placement)

    @property
    def num_tokens(self) -> int:
        return self.position.num_tokens


class Compat(NamedTuple):
    ok: bool
    reason: str


def compat(state: KVState, target: ModelIdentity | KVState) -> Compat:
    """AAFLOW+ eq. 13: equal M, equal Θ, and position encodings that agree.

    ``target`` is the model that wants to reuse ``state`` or another state to combine with.
    """
    model_id = target.model_id
    config_hash = target.config_hash
    rope = target.rope if isinstance(target, ModelIdentity) else target.position.rope
    if state.model_id != model_id:
        return Compat(False, f"state is from model {state.model_id!r}, not {model_id!r}")
    if state.config_hash != config_hash:
        return Compat(False, f"state has config hash {state.config_hash}, model has {config_hash}")
    if state.position.rope != rope:
        return Compat(False, f"state was rotated with {state.position.rope}, model uses {rope}")
    return Compat(True, "compatible")


def require_compat(state: KVState, target: ModelIdentity | KVState) -> None:
    """Raise :class:`IncompatibleState` unless ``compat(state, target)`` holds."""
    ok, reason = compat(state, target)
    if not ok:
        raise IncompatibleState(f"KV state {state.state_id!r} cannot be reused: {reason}; recompute it with this model")
