"""Which kernel a model's linear layers multiply their weights with: torch's own or oneDNN.

A float32 ``nn.Linear`` on the CPU goes to torch's BLAS (MKL in its x86 wheels). On this
repo's 2-core AMD EPYC host, one thread, the 30 MLPs of SmolLM2-135M's shape took 13.1 / 40.9 /
202 ms at 1 / 16 / 128 rows with it (62 GFLOP/s at 16 rows, 101 at 128), and 10.4 / 23.5 /
95.9 ms with oneDNN (108 and 213 GFLOP/s); SmolLM2's output head (576 → 49,152) 14.0 ms at 16
rows against 7.2, 4.8 ms at one row against 2.6. The engine loop's many-row steps are bound by
these products, a one-row step mostly by reading the weights, so the slower kernel cost the
batched path most.

oneDNN is reached through torch's ``mkldnn::_linear_pointwise`` (the op torch's compiler fuses
CPU linear layers into, ``torch/_inductor/fx_passes/mkldnn_fusion.py``), which takes the dense
weight as it is: nothing is copied or
converted, a head tied to the token embedding stays tied, and the model's parameters (and so
its identity) are unchanged. Which kernel is faster depends on the host and the model's size (a
tiny test model's products are all call overhead), so :func:`use_linear_kernel` with
``"auto"`` times one decoder layer's MLP both ways over ``ROWS`` rows and keeps oneDNN only when
it is clearly faster (``MIN_GAIN``); ``"torch"`` and ``"onednn"`` force a kernel. Either way
every linear layer of the model (attention projections, MLP, head) runs on the kernel kept.

Both kernels compute in float32; their results differ in rounding only (the tests bound it),
so a model's KV is the same model's KV whichever kernel computed it.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from graphflow.runtime.batch_limits import check_linear_kernel

__all__ = ["OneDnnLinear", "onednn_unsupported", "use_linear_kernel"]

ROWS = 16  # rows the choice is timed at: a many-row decode step's
MIN_GAIN = 0.8  # oneDNN is kept when its time is at most this fraction of torch's


class OneDnnLinear(torch.nn.Module):
    """A float32 ``nn.Linear`` computed by oneDNN, over the very weight (and bias) parameters
    of the layer it replaces."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # NOTE: the same parameter, not a copy: a tied head stays tied
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [None], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def onednn_unsupported(model: Any) -> str:
    """Why ``model``'s linear layers cannot run on oneDNN ("" when they can)."""
    weight = model.lm_head.weight
    if weight.device.type != "cpu":
        return f"oneDNN linear layers are for models on the CPU; this one is on {weight.device.type}"
    if weight.dtype != torch.float32:
        dtype = str(weight.dtype).removeprefix("torch.")
        return f"oneDNN linear layers are used for float32 models; this one is {dtype}"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch was built without oneDNN's linear op (mkldnn::_linear_pointwise)"
    return ""


def use_linear_kernel(model: Any, kernel: str = "auto", clock: Callable[[], float] = time.perf_counter) -> str:
    """Run ``model``'s linear layers on ``kernel`` (see the module docstring) and
    return the kernel they now run on, ``"torch"`` or ``"onednn"``. ``"auto"`` measures on the
    calling thread as it is set (call it on a thread with the torch threads the model will
    compute with)."""
    check_linear_kernel(kernel)
    why = onednn_unsupported(model)
    if kernel == "onednn" and why:
        raise ValueError(f"cannot run the linear layers on oneDNN: {why}")
    if kernel == "torch" or why or (kernel == "auto" and not _onednn_faster(model, clock)):
        return "torch"
    _convert(model)
    return "onednn"


def _convert(module: torch.nn.Module) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, OneDnnLinear(child))
        else:
            _convert(child)


@torch.inference_mode()
def _onednn_faster(model: Any, clock: Callable[[], float], repeats: int = 7) -> bool:
    """Whether the first decoder layer's MLP over ``ROWS`` rows runs in at most ``MIN_GAIN``
    of torch's time on oneDNN (a converted twin of it, over the same weights, is timed; medians of
    ``repeats``)."""
    mlp = model.model.layers[0].mlp
    converted = copy.deepcopy(mlp, memo={id(p): p for p in mlp.parameters()})  # NOTE: the weights are shared
    _convert(converted)
    x = torch.randn(1, ROWS, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    x = x.to(model.lm_head.weight.dtype)

    times: dict[torch.nn.Module, list[float]] = {mlp: [], converted: []}
    for fn in times:
        fn(x)  # NOTE: warm: the first call picks (oneDNN: builds) its kernel
    for _ in range(repeats):  # NOTE: alternating, so a slow moment of the host hits both
        for fn, got in times.items():
            begin = clock()
            fn(x)
            got.append(clock() - begin)
    return statistics.median(times[converted]) <= MIN_GAIN * statistics.median(times[mlp])
