"""Results of ``graphflow bench transport``: one :class:`TransportRow` per backend × size, one
:class:`PeerResult` per peer library.

Rows hold the measured medians; the rates and ratios are derived from them (properties), and
``to_json`` writes both, under the keys the CSVs and ``--json`` have always used. Rows made in
a benchmark's child processes come back through ``TransportRow.from_json``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

__all__ = ["PeerResult", "PeerRow", "TransportRow", "with_peers"]


@dataclass(frozen=True, slots=True)
class TransportRow:
    backend: str
    nbytes: int
    blocks: int
    block_bytes: int
    ours_s: float  # median seconds per transfer, ours
    raw_s: float  # the backend's plain reference
    bare_s: float | None = None  # ucx and mpi: the wire's messages, hashed on arrival, no protocol
    ours_ms: tuple[float, ...] = ()  # every timed transfer (local and ray backends)
    raw_ms: tuple[float, ...] = ()
    peer_gbps: Mapping[str, float | None] = field(default_factory=dict)  # ucx rows, when peers ran

    @property
    def ours_gbps(self) -> float:
        return self.nbytes / self.ours_s / 1e9

    @property
    def raw_gbps(self) -> float:
        return self.nbytes / self.raw_s / 1e9

    @property
    def ratio(self) -> float:
        """Ours ÷ raw, in throughput."""
        return self.raw_s / self.ours_s

    @property
    def overhead_us(self) -> float:
        return (self.ours_s - self.raw_s) * 1e6

    @property
    def bare_gbps(self) -> float | None:
        return self.nbytes / self.bare_s / 1e9 if self.bare_s else None

    @property
    def bare_ratio(self) -> float | None:
        """Bare ÷ raw, in throughput: the share of the plain reference's rate the bare ceiling keeps."""
        return self.raw_s / self.bare_s if self.bare_s else None

    @property
    def ours_over_bare(self) -> float | None:
        return self.bare_s / self.ours_s if self.bare_s else None

    @property
    def ours_over_peer(self) -> dict[str, float | None]:
        return {k: (self.ours_gbps / v if v else None) for k, v in self.peer_gbps.items()}

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None and v != () and v != {}}
        derived = ("ours_gbps", "raw_gbps", "ratio", "overhead_us", "bare_gbps", "bare_ratio", "ours_over_bare")
        out.update({k: getattr(self, k) for k in derived if getattr(self, k) is not None})
        out.update({k: list(out[k]) for k in ("ours_ms", "raw_ms") if k in out})
        if self.peer_gbps:
            out["peer_gbps"], out["ours_over_peer"] = dict(self.peer_gbps), self.ours_over_peer
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TransportRow:
        """A row as ``to_json`` wrote it (derived keys are ignored)."""
        kept = {f.name: obj[f.name] for f in fields(cls) if f.name in obj}
        for k in ("ours_ms", "raw_ms"):
            if k in kept:
                kept[k] = tuple(kept[k])
        return cls(**kept)


@dataclass(frozen=True, slots=True)
class PeerRow:
    """One size moved by a peer library on ours' plan (read by the receiver, bytes checked after)."""

    nbytes: int
    blocks: int
    peer_s: float
    checksums: bool = False  # whether the library checks what it moves (neither peer does)
    verified_after: bool = True  # the reader cleared its blocks, read once more and compared

    @property
    def peer_gbps(self) -> float:
        return self.nbytes / self.peer_s / 1e9

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "peer_gbps": self.peer_gbps}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PeerRow:
        return cls(**{f.name: obj[f.name] for f in fields(cls) if f.name in obj})


@dataclass(frozen=True, slots=True)
class PeerResult:
    """A peer's rows, or why it could not run here (then ``rows`` is empty)."""

    peer: str
    rows: tuple[PeerRow, ...] = ()
    unavailable: str = ""

    def at(self, nbytes: int) -> PeerRow | None:
        return next((r for r in self.rows if r.nbytes == nbytes), None)

    def to_json(self) -> dict[str, Any]:
        if self.unavailable:
            return {"peer": self.peer, "unavailable": self.unavailable}
        return {"peer": self.peer, "rows": [r.to_json() for r in self.rows]}


def with_peers(rows: Sequence[TransportRow], peers: Sequence[PeerResult], backend: str = "ucx") -> list[TransportRow]:
    """``rows`` with each peer's rate at the same size on ``backend``'s rows (``None`` where a
    peer did not run or lacks that size); other backends' rows are returned as they are."""
    if not peers:
        return list(rows)
    out = []
    for row in rows:
        if row.backend == backend:
            found = {p.peer: p.at(row.nbytes) for p in peers}
            row = replace(row, peer_gbps={k: (r.peer_gbps if r else None) for k, r in found.items()})
        out.append(row)
    return out
