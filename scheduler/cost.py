"""Cost model: pure functions over frozen dataclasses, seconds as float, bytes as int.

* ``T_prefill(L) = a + b·L + c·L²`` — linear work per token plus quadratic attention (the
  standard prefill shape; AAFLOW+ uses a constant per-token cost, eq. 41). Fitted per model and
  replica from measured prefills (``scheduler.calibrate``).
* ``T_transfer(bytes) = bytes / bandwidth + latency`` — the Hockney α-β model (AAFLOW+ eq. 42),
  with α and β *measured* per backend and peer pair by ``transport.probe``.
* ``T_resume(bytes) = r0 + r1·bytes`` — rebuilding a cache from received blocks (measured).
* ``T_reconstruct(bytes) = q0 + q1·bytes`` — base + residual → KV (GraphFlow; measured).
* ``T_step(rows, L)`` — one engine-loop decode step of ``rows`` requests continuing one
  ``L``-token context, *measured* at a few row counts and two contexts and interpolated
  linearly between them (a step's cost is not linear in its rows: on a 2-core host a second
  row added about 40% to a one-row step and the third and fourth almost nothing, as the README
  says with its command); times ``κ`` while the deployment's other replicas step
  too (they share the host's memory traffic and cores; ``κ = 1`` on hosts of their own).
  Measured at calibration (``runtime.calibration.decode_samples``).

Hardware numbers are parameters, never constants in here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DecodeModel",
    "LinearCost",
    "LinkMatrix",
    "LinkSpec",
    "PrefillModel",
    "t_prefill",
    "t_prefill_suffix",
    "t_transfer",
]


@dataclass(frozen=True, slots=True)
class PrefillModel:
    """``a + b·L + c·L²`` seconds for a prefill of ``L`` tokens (from scratch)."""

    a: float
    b: float
    c: float
    model: str = ""
    replica: str = ""

    def __post_init__(self) -> None:
        if self.b < 0 or self.c < 0:
            raise ValueError(f"prefill model needs non-negative b and c, got b={self.b}, c={self.c}")

    def __call__(self, tokens: int) -> float:
        return t_prefill(self, tokens)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A measured link between two peers over one backend."""

    backend: str
    bandwidth_bytes_per_s: float
    latency_s: float
    src: str = ""
    dst: str = ""

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError(
                f"link {self.backend} {self.src}→{self.dst}: bandwidth must be positive, "
                f"got {self.bandwidth_bytes_per_s}; re-run the probe"
            )
        if self.latency_s < 0:
            raise ValueError(f"link {self.backend}: latency must be non-negative, got {self.latency_s}")

    @property
    def gbps(self) -> float:
        return self.bandwidth_bytes_per_s * 8 / 1e9


@dataclass(frozen=True, slots=True)
class LinkMatrix:
    """Measured links per ordered peer pair ``(src, dst)``; ``default`` answers pairs that were
    not measured (``None``: such a pair is an error)."""

    pairs: dict[tuple[str, str], LinkSpec]
    default: LinkSpec | None = None

    @classmethod
    def uniform(cls, link: LinkSpec) -> LinkMatrix:
        """One link for every pair (a model, e.g. for tests or a homogeneous cluster)."""
        return cls({}, link)

    def link(self, src: str, dst: str) -> LinkSpec:
        found = self.pairs.get((src, dst), self.default)
        if found is None:
            raise ValueError(f"no measured link {src} → {dst} (measured: {sorted(self.pairs)}); recalibrate")
        return found

    def measured(self) -> list[dict[str, object]]:
        """Each measured pair as JSON (``src``, ``dst``, ``bandwidth_bytes_per_s``, ``latency_s``),
        in pair order; the default is not a measurement and is left out."""
        return [
            {"src": a, "dst": b, "bandwidth_bytes_per_s": ln.bandwidth_bytes_per_s, "latency_s": ln.latency_s}
            for (a, b), ln in sorted(self.pairs.items())
        ]

    @property
    def slowest(self) -> LinkSpec:
        """The lowest-bandwidth link (what a summary should quote as the floor)."""
        links = [*self.pairs.values(), *([self.default] if self.default else [])]
        if not links:
            raise ValueError("the link matrix is empty")
        return min(links, key=lambda s: s.bandwidth_bytes_per_s)


@dataclass(frozen=True, slots=True)
class LinearCost:
    """``fixed_s + per_byte_s · bytes`` (resume, reconstruct)."""

    fixed_s: float
    per_byte_s: float

    def __call__(self, nbytes: int) -> float:
        return self.fixed_s + self.per_byte_s * nbytes


@dataclass(frozen=True, slots=True)
class DecodeModel:
    """Seconds of one decode step of ``rows[j]`` requests continuing a ``contexts[i]``-token
    context, ``seconds[i][j]``; :meth:`step_s` interpolates linearly in rows, then in context,
    and extends the outer segments beyond the grid. ``contention`` (≥ 1) multiplies a step while
    every other replica of the deployment steps too."""

    rows: tuple[int, ...]
    contexts: tuple[int, int]
    seconds: tuple[tuple[float, ...], tuple[float, ...]]
    contention: float = 1.0

    def __post_init__(self) -> None:
        if len(self.rows) < 2 or list(self.rows) != sorted(set(self.rows)) or self.rows[0] < 1:
            raise ValueError(f"a decode model needs two or more ascending row counts from 1, got {self.rows}")
        if not 0 < self.contexts[0] < self.contexts[1]:
            raise ValueError(f"a decode model needs two ascending context lengths, got {self.contexts}")
        if any(len(row) != len(self.rows) or min(row) < 0 for row in self.seconds) or len(self.seconds) != 2:
            raise ValueError("a decode model needs non-negative seconds for every row count at both contexts")
        if self.contention < 1:
            raise ValueError(f"contention is a slowdown, at least 1, got {self.contention}")

    def step_s(self, rows: int, context: int) -> float:
        """Seconds of one step of ``rows`` rows over ``context`` tokens (0 for no rows)."""
        if rows < 0 or context < 0:
            raise ValueError(f"rows and context must be non-negative, got {rows}, {context}")
        if rows == 0:
            return 0.0
        short, long = (_interpolate(self.rows, s, rows) for s in self.seconds)
        c0, c1 = self.contexts
        return max(0.0, short + (long - short) * (context - c0) / (c1 - c0))


def _interpolate(xs: tuple[int, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise-linear ``y(x)`` through the points, the outer segments extended."""
    j = next((i for i in range(1, len(xs) - 1) if x < xs[i]), len(xs) - 1)
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def t_prefill(m: PrefillModel, tokens: int) -> float:
    """Seconds to prefill ``tokens`` from an empty cache (0 for no tokens)."""
    if tokens < 0:
        raise ValueError(f"tokens must be non-negative, got {tokens}")
    return 0.0 if tokens == 0 else max(0.0, m.a + m.b * tokens + m.c * tokens * tokens)


def t_prefill_suffix(m: PrefillModel, cached: int, total: int) -> float:
    """Seconds to prefill tokens ``[cached, total)`` on top of a cache of ``cached`` tokens.

    The suffix pays the per-token work for its own tokens and attention over all earlier
    ones: ``a + b·n + c·(total² − cached²)`` with ``n = total − cached``.
    """
    if not 0 <= cached <= total:
        raise ValueError(f"need 0 <= cached <= total, got {cached}, {total}")
    n = total - cached
    if n == 0:
        return 0.0
    return max(0.0, m.a + m.b * n + m.c * (total * total - cached * cached))


def t_transfer(nbytes: int, link: LinkSpec) -> float:
    """``bytes / bandwidth + latency`` (0 bytes cost nothing: no transfer happens)."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be non-negative, got {nbytes}")
    return 0.0 if nbytes == 0 else nbytes / link.bandwidth_bytes_per_s + link.latency_s
