"""Fit the cost model from measurements; save and load a cluster profile (JSON).

Inputs are plain measurement lists — ``(tokens, seconds)`` prefills from the engine,
``(bytes, seconds)`` transfers from ``transport.probe`` — so fitting is pure and testable.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from scheduler.cost import DecodeModel, LinearCost, LinkSpec, PrefillModel

__all__ = [
    "PROFILE_VERSION",
    "Profile",
    "fit_decode",
    "fit_linear",
    "fit_link",
    "fit_prefill",
    "load_profile",
    "save_profile",
]

PROFILE_VERSION = 1


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients for every column but the first
    (columns that go negative are dropped, cumulatively, and the rest refitted)."""
    dropped: set[int] = set()
    while True:
        keep = [j for j in range(x.shape[1]) if j not in dropped]
        sub, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        coef = np.zeros(x.shape[1])
        coef[keep] = sub
        bad = {j for j in keep if j > 0 and coef[j] < 0}
        if not bad:
            return coef
        dropped |= bad


def fit_prefill(samples: Sequence[tuple[int, float]], model: str = "", replica: str = "") -> PrefillModel:
    """Fit ``a + b·L + c·L²`` (b, c ≥ 0) to measured ``(tokens, seconds)`` pairs.

    Relative least squares (each residual divided by its measurement) so short prefills
    count as much as long ones. Needs at least three distinct lengths.
    """
    if len({t for t, _ in samples}) < 3:
        raise ValueError("fitting a prefill curve needs measurements at three or more context lengths")
    L = np.array([t for t, _ in samples], dtype=np.float64)
    y = np.array([s for _, s in samples], dtype=np.float64)
    x = np.stack([np.ones_like(L), L, L * L], axis=1) / y[:, None]
    a, b, c = _nnls(x, np.ones_like(y))
    return PrefillModel(float(a), float(b), float(c), model, replica)


def fit_decode(samples: Sequence[tuple[int, int, float]], contention: float = 1.0) -> DecodeModel:
    """The step table of measured ``(rows, context, seconds)`` decode steps: every row count at
    each of two contexts, the median where a point was measured more than once, and each
    context's seconds made non-decreasing in rows (a step of more rows never costs less);
    ``contention`` (clamped to ≥ 1) is measured apart."""
    rows = sorted({r for r, _, _ in samples})
    contexts = sorted({c for _, c, _ in samples})
    if len(rows) < 2 or len(contexts) != 2 or len(samples) < 2 * len(rows):
        raise ValueError("fitting decode steps needs two or more row counts, each measured at two context lengths")
    table = []
    for c in contexts:
        seconds, floor = [], 0.0
        for r in rows:
            got = [s for q, n, s in samples if (q, n) == (r, c)]
            if not got:
                raise ValueError(f"no decode step measured for {r} rows over {c} tokens")
            floor = max(floor, float(np.median(got)))
            seconds.append(floor)
        table.append(tuple(seconds))
    return DecodeModel(tuple(rows), (contexts[0], contexts[1]), (table[0], table[1]), max(1.0, contention))


def fit_linear(samples: Sequence[tuple[int, float]]) -> LinearCost:
    """``fixed + per_byte·bytes`` (per_byte ≥ 0) from ``(bytes, seconds)`` pairs."""
    if len({b for b, _ in samples}) < 2:
        raise ValueError("fitting a linear cost needs measurements at two or more sizes")
    n = np.array([b for b, _ in samples], dtype=np.float64)
    y = np.array([s for _, s in samples], dtype=np.float64)
    x = np.stack([np.ones_like(n), n], axis=1) / y[:, None]
    f, p = _nnls(x, np.ones_like(y))
    return LinearCost(max(0.0, float(f)), float(p))


def fit_link(samples: Sequence[tuple[int, float]], backend: str, src: str = "", dst: str = "") -> LinkSpec:
    """α-β fit of measured transfers: latency = fixed cost, bandwidth = 1 / per-byte cost."""
    lin = fit_linear(samples)
    if lin.per_byte_s <= 0:
        raise ValueError(f"{backend}: transfer time did not grow with size; measure larger transfers")
    return LinkSpec(backend, 1.0 / lin.per_byte_s, lin.fixed_s, src, dst)


@dataclass(frozen=True, slots=True)
class Profile:
    """Everything the policy needs for one model on one cluster."""

    model: str
    config_hash: str
    kv_bytes_per_token: int
    prefill: PrefillModel
    resume: LinearCost
    links: dict[str, LinkSpec] = field(default_factory=dict)
    reconstruct: LinearCost | None = None  # base + residual → KV, by residual bytes (None: not measured)

    def link(self, backend: str) -> LinkSpec:
        try:
            return self.links[backend]
        except KeyError:
            raise ValueError(
                f"the profile has no measured {backend!r} link (has {sorted(self.links)}); "
                f"run `graphflow calibrate --backends {backend}`"
            ) from None


def save_profile(path: str | Path, p: Profile) -> None:
    data = {
        "version": PROFILE_VERSION,
        "model": p.model,
        "config_hash": p.config_hash,
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "prefill": asdict(p.prefill),
        "resume": asdict(p.resume),
        "links": {k: asdict(v) for k, v in p.links.items()},
        "reconstruct": asdict(p.reconstruct) if p.reconstruct is not None else None,
    }
    Path(path).write_text(json.dumps(data, indent=2))


def load_profile(path: str | Path, model: str | None = None, config_hash: str | None = None) -> Profile:
    """Read a profile; refuses another version, model or model config with a clear message."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no profile at {path}; run `graphflow calibrate --model M --out {path}` first")
    d = json.loads(path.read_text())
    if d.get("version") != PROFILE_VERSION:
        raise ValueError(f"profile {path} is version {d.get('version')}, expected {PROFILE_VERSION}; recalibrate")
    if model is not None and d["model"] != model:
        raise ValueError(f"profile {path} was calibrated for {d['model']!r}, not {model!r}; recalibrate for {model}")
    if config_hash is not None and d["config_hash"] != config_hash:
        raise ValueError(f"profile {path} was calibrated for another configuration of {d['model']}; recalibrate")
    return Profile(
        model=d["model"],
        config_hash=d["config_hash"],
        kv_bytes_per_token=int(d["kv_bytes_per_token"]),
        prefill=PrefillModel(**d["prefill"]),
        resume=LinearCost(**d["resume"]),
        links={k: LinkSpec(**v) for k, v in d["links"].items()},
        reconstruct=LinearCost(**d["reconstruct"]) if d.get("reconstruct") else None,
    )
