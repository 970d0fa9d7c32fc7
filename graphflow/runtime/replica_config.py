"""What one replica runs with: model, KV store, transport, engine loop, KV mode. Checked when
made (one sentence per mistake); ``runtime.actors`` builds one per replica from the deployment."""

from __future__ import annotations

from dataclasses import dataclass

from graphflow.runtime.batch_limits import BATCH_ROWS, MAX_BATCH_TOKENS, check_linear_kernel
from graphflow.runtime.kept import check_policy

__all__ = ["ReplicaConfig", "check_device"]


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    name: str
    model: str = "tiny-llama"
    capacity_bytes: int = 1 << 30
    block_tokens: int = 16
    device: str = "cpu"
    transport: str = "ucx"  # ucx | ray | local (peers reach the replica over this backend)
    timeout_s: float = 120.0
    kv_mode: str = "exact"  # exact | differential | stateless (kv.differential.template_kv)
    recompute_head: int = 12  # differential: template tokens recomputed, not rebuilt
    recompute_fraction: float = 0.0  # … or this fraction of each template's tokens, where more
    residual_refs: int = 4  # differential: exact executions averaged into a path's residual
    hot_min_count: int = 2  # differential: executions that make a path hot (others are pruned)
    eviction: str = "score"  # score | oldest
    node: str = ""  # the cluster node it runs on ("" = this host)
    host: str = ""  # that node's IP address ("" = this host)
    threads: int = 0  # torch threads of the engine (0: every core of the host, as a plain process gets)
    prefault_bytes: int = 0  # memory faulted in at start for received KV (0: on demand); yields to computed KV
    batching: bool = True  # nodes share forward passes in one engine loop (runtime.batcher); off: one at a time
    max_batch_tokens: int = MAX_BATCH_TOKENS  # tokens one engine step runs (decodes + prefill chunks)
    max_queue: int = 64  # node requests the engine loop holds (the actor's concurrency stays below it)
    linear_kernel: str = "auto"  # auto | torch | onednn: what the model's linear layers run on (models.linear_kernel)

    def __post_init__(self) -> None:
        check_policy(self.eviction)
        if self.batching and not self.max_batch_tokens > BATCH_ROWS:
            raise ValueError(
                f"max_batch_tokens must exceed {BATCH_ROWS} (a step holds every decode), got {self.max_batch_tokens}"
            )
        check_device(self.device)
        check_linear_kernel(self.linear_kernel)
        if self.threads < 0 or self.prefault_bytes < 0:
            raise ValueError(
                f"threads and prefault_bytes must be non-negative, got {self.threads}, {self.prefault_bytes}"
            )


def check_device(device: str) -> None:
    """Refuse a device a replica cannot run on (``ValueError``, one sentence)."""
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"device must be cpu or cuda[:N], got {device!r}")
