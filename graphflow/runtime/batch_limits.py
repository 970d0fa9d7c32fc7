"""The engine loop's default limits (:mod:`graphflow.runtime.batcher`) and the engine's linear
kernels (:mod:`graphflow.models.linear_kernel`), in a module of their own that imports nothing,
so the CLI and the client name them without importing torch."""

MAX_BATCH_TOKENS = 128  # tokens one engine step runs (decodes, then prefill); before steps paused for a
# short arrival, 256 doubled a short request's wait during a long prefill (experiments/throughput/README.md)
BATCH_ROWS = 32  # requests one engine step runs at most
LINEAR_KERNELS = ("auto", "torch", "onednn")  # what a replica's model's linear layers run on (auto: measured)


def check_linear_kernel(kernel: str) -> None:
    """Refuse an unknown linear kernel (``ValueError``, one sentence)."""
    if kernel not in LINEAR_KERNELS:
        raise ValueError(f"unknown linear kernel {kernel!r}; use one of {', '.join(LINEAR_KERNELS)}")


__all__ = ["BATCH_ROWS", "LINEAR_KERNELS", "MAX_BATCH_TOKENS", "check_linear_kernel"]
