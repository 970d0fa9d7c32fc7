"""How many rows a step's MLP and head run over, measured on the host that runs them.

A CPU BLAS picks its sgemm kernel by the shape it is given, and for the small row counts of
decode steps some shapes take a much slower path than a larger one would. Scratch timings on
this repo's 2-core AMD EPYC host, one thread, fp32: SmolLM2-135M's head (576 → 49,152) took
9.4 / 23.7 / 32.7 / 17.0 ms at 1 / 2 / 3 / 4 rows, and a whole decode step over a 2K-token
shared prefix at 3 rows 145 ms unpadded against 113 ms with the MLP and the head run over 4
rows (zero rows added, their outputs dropped). The cliffs move with the host: an earlier host of
this project had them at 9–15 rows (a 12-row head 43 ms against 26 ms at 16, which is why steps
of 9–15 rows were padded to 16 until now), where on this one a 12-row step runs 155 ms unpadded
and 176 ms padded to 16. So the engine loop measures, once at its start, what the padded part
of a step costs at each row count, and pads a step to the row count that is cheapest from there
up (:meth:`GemmPadding.measure`); a forward given no plan pads nothing.

::

    rows n      1    2    3    4  …  16        measured: MLP of every layer + head over n rows
    to[n - 1]   1    4    4    4  …  16        to the cheapest m ≥ n (≥ 10% and 0.5 ms faster)

Padding changes float rounding only as packing rows already does (``ragged``'s module doc).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["GemmPadding"]

MEASURED_ROWS = 16  # row counts measured (a step of more rows runs unpadded)
MIN_GAIN = 0.9  # pad only to a row count at most this fraction of the unpadded time
MIN_SAVING_S = 5e-4  # and only when that saves this much a step (a tiny model's timings are noise)


@dataclass(frozen=True)
class GemmPadding:
    """``to[n - 1]``: the rows the MLP and the head compute for a step of ``n`` rows (``n`` past
    the table: ``n``)."""

    to: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        bad = [(n, m) for n, m in enumerate(self.to, start=1) if m < n]
        if bad:
            raise ValueError(f"a step of n rows cannot run over fewer rows; got (n, rows) {bad}")

    def rows(self, n: int) -> int:
        """The rows to compute for ``n`` real ones."""
        return self.to[n - 1] if 1 <= n <= len(self.to) else n

    @property
    def padded(self) -> dict[int, int]:
        """The row counts that are padded, and to what."""
        return {n: m for n, m in enumerate(self.to, start=1) if m != n}

    @classmethod
    def from_seconds(
        cls, seconds: Sequence[float], gain: float = MIN_GAIN, min_saving_s: float = MIN_SAVING_S
    ) -> GemmPadding:
        """The plan for ``seconds[n - 1]``, the padded part's time at ``n`` rows: each ``n``
        runs over the row count ``m ≥ n`` of least time when that is at most ``gain`` × its own
        and at least ``min_saving_s`` less (below either, the difference is noise, not worth
        the extra rows)."""
        if not 0 < gain <= 1 or min_saving_s < 0 or any(s <= 0 for s in seconds):
            raise ValueError(
                f"need times > 0, 0 < gain ≤ 1 and a saving ≥ 0, got {list(seconds)}, {gain}, {min_saving_s}"
            )
        to = []
        for n in range(1, len(seconds) + 1):
            best = min(range(n, len(seconds) + 1), key=lambda m: (seconds[m - 1], m))
            worth = seconds[best - 1] <= min(gain * seconds[n - 1], seconds[n - 1] - min_saving_s)
            to.append(best if worth else n)
        return cls(tuple(to))

    @classmethod
    @torch.inference_mode()
    def measure(
        cls,
        model: Any,
        max_rows: int = MEASURED_ROWS,
        repeats: int = 5,
        clock: Callable[[], float] = time.perf_counter,
    ) -> GemmPadding:
        """Time ``model``'s MLP of every decoder layer plus its head over 1 … ``max_rows`` rows
        (the part of a step :func:`~graphflow.models.ragged.forward_layers` pads), ``repeats``
        rounds over every row count, the median each, on the calling thread as it is set (run it
        on the thread that steps), and plan from them (:meth:`from_seconds`). Weights stream
        from memory as in a step (every layer in turn, then the head). SmolLM2-135M on one core:
        about 4 s."""
        if max_rows < 1 or repeats < 1:
            raise ValueError(f"max_rows and repeats must be at least 1, got {max_rows}, {repeats}")
        base, device = model.model, model.lm_head.weight.device
        layers = base.layers[: model.config.num_hidden_layers]
        width, dtype = model.config.hidden_size, model.lm_head.weight.dtype
        gen = torch.Generator().manual_seed(0)
        inputs = [torch.randn(n, width, generator=gen).to(device, dtype) for n in range(1, 1 + max_rows)]

        def part(x: torch.Tensor) -> None:
            for layer in layers:
                layer.mlp(x)
            model.lm_head(x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        part(inputs[-1])  # NOTE: warm: first calls allocate and pick kernels
        times: list[list[float]] = [[] for _ in inputs]
        for _ in range(repeats):
            for x, got in zip(inputs, times, strict=True):
                begin = clock()
                part(x)
                got.append(clock() - begin)
        return cls.from_seconds([max(statistics.median(t), 1e-9) for t in times])
