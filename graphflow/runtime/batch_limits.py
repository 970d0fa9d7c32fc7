"""The engine loop's default limits (:mod:`graphflow.runtime.batcher`), in a module of their
own that imports nothing, so the CLI and the client name them without importing torch."""

MAX_BATCH_TOKENS = 128  # tokens one engine step runs (decodes, then prefill); before steps paused for a
# short arrival, 256 doubled a short request's wait during a long prefill (experiments/throughput/README.md)
BATCH_ROWS = 32  # requests one engine step runs at most

__all__ = ["BATCH_ROWS", "MAX_BATCH_TOKENS"]
