"""Which kernel a model's decoder layers multiply their weights with: torch's own or oneDNN.

A float32 ``nn.Linear`` on the CPU goes to torch's BLAS (MKL in its x86 wheels). On this
repo's 2-core AMD EPYC host, one thread, the 30 MLPs of SmolLM2-135M's shape took 13.6 / 41.1 / 200 ms at
1 / 16 / 128 rows with it (62 GFLOP/s at 16 rows, 102 at 128), and 10.3 / 23.5 / 95.6 ms with
oneDNN (torch's ``mkldnn_linear``, weights held as oneDNN tensors: 109 and 213 GFLOP/s). The
engine loop's many-row steps are bound by these products, a one-row step mostly by reading the
weights, so the slower kernel cost the batched path most: the engine loop over one replica's
share of the 16-workflow throughput workload (16 agents over 8 roots of 1,024 tokens, scratch
timing in one process) ran 7.8 s with torch's kernel and 6.2 s with oneDNN's, while each agent
alone went from 1.27 to 1.21 s.

Which one is faster depends on the host and the model's size (a tiny test model's products are
all call overhead, where torch's is faster), so :func:`use_linear_kernel` with ``"auto"``
times one decoder layer's MLP both ways over ``ROWS`` rows and keeps oneDNN only when it is
clearly faster (``MIN_GAIN``); ``"torch"`` and ``"onednn"`` force a kernel. It converts every
linear layer of the decoder layers (attention projections and MLP), one layer at a time, so the
weights are never held twice. The output head stays on torch's kernel: in the models here it
shares its weights with the token embedding, and a oneDNN copy would hold them twice (113 MB
for SmolLM2).

Both kernels compute in float32; their results differ in rounding only (the tests bound it),
so a model's KV is the same model's KV whichever kernel computed it.
"""

from __future__ import annotations

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
    """A float32 ``nn.Linear`` computed by oneDNN: its weight (and bias) held as oneDNN
    tensors, the input converted on the way in and the output on the way out."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", linear.weight.detach().to_mkldnn())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to_mkldnn())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch._C._nn.mkldnn_linear(x.contiguous().to_mkldnn(), self.weight, self.bias).to_dense()

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
    if not torch.backends.mkldnn.is_available():
        return "this torch was built without oneDNN (mkldnn)"
    return ""


def use_linear_kernel(model: Any, kernel: str = "auto", clock: Callable[[], float] = time.perf_counter) -> str:
    """Run ``model``'s decoder linear layers on ``kernel`` (see the module docstring) and
    return the kernel they now run on, ``"torch"`` or ``"onednn"``. ``"auto"`` measures on the
    calling thread as it is set (call it on a thread with the torch threads the model will
    compute with)."""
    check_linear_kernel(kernel)
    why = onednn_unsupported(model)
    if kernel == "onednn" and why:
        raise ValueError(f"cannot run the linear layers on oneDNN: {why}")
    if kernel == "torch" or why or (kernel == "auto" and not _onednn_faster(model, clock)):
        return "torch"
    for layer in model.model.layers:
        _convert(layer)
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
    of torch's time on oneDNN (a converted copy of it is timed; medians of ``repeats``)."""
    import copy

    mlp = model.model.layers[0].mlp
    converted = copy.deepcopy(mlp)
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
