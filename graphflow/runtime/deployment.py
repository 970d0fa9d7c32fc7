"""What a deployment serves: the settings ``graphflow serve`` and ``connect()`` start replicas
with, checked before anything starts (one sentence per mistake) and kept on the deployment's
board, so a second ``serve`` or an embedded client can tell whether it runs the same thing."""

from __future__ import annotations

from dataclasses import dataclass

from graphflow.kv.differential.modes import kv_mode as kv_mode_of
from graphflow.runtime.batch_limits import BATCH_ROWS, MAX_BATCH_TOKENS, check_linear_kernel
from graphflow.runtime.replica_config import check_device
from graphflow.workflow.templates import template_set

__all__ = ["TRANSPORTS", "Deployment", "gpu_shortfall", "gpus_for", "replica_threads"]

TRANSPORTS = ("ucx", "ray")  # how served replicas move KV between each other


def gpus_for(device: str, asked: float | None) -> float:
    """The GPUs Ray reserves per replica: what was ``asked``, else one per replica on ``cuda``
    and none on ``cpu``."""
    if asked is not None:
        return asked
    return 1.0 if device.startswith("cuda") else 0.0


def gpu_shortfall(want: Deployment, node_gpus: list[float]) -> str:
    """Why Ray could never place ``want``'s replicas on nodes with ``node_gpus`` GPUs each (in
    ``spread`` order), as one sentence; ``""`` when it could. Ray keeps an actor it cannot place
    pending without end, so ``serve --device cuda`` on a host with no GPU would wait forever.
    A replica takes ``gpus_per_replica`` of one node's GPUs (a fraction shares a GPU)."""
    need = want.gpus_per_replica
    if need <= 0:
        return ""
    fits = [_replicas_on(gpus, need) for gpus in node_gpus]
    if want.spread and node_gpus:
        counts = [len(range(i, want.replicas, len(node_gpus))) for i in range(len(node_gpus))]
        short = sum(max(0, c - f) for c, f in zip(counts, fits, strict=True))
    else:
        short = max(0, want.replicas - sum(fits))
    if not short:
        return ""
    return (
        f"replicas on {want.device} take {need:g} GPU each ({want.replicas} asked for), but this Ray cluster's GPUs "
        f"total {sum(node_gpus):g} over {_count(len(node_gpus), 'node')} "
        f"({_count(short, 'replica')} could never start); start Ray on nodes with GPUs, "
        "lower --gpus-per-replica or --replicas, or serve with --device cpu"
    )


def replica_threads(want: Deployment, node_cpus: list[float]) -> list[int]:
    """Torch threads for each of ``want``'s replicas, in order: ``want.threads`` where given;
    with 0, the CPUs Ray counts on the replica's node shared evenly by the deployment's replicas
    there (at least one each), so two replicas on one host do not each run a thread per core and
    step each other's kernels off the cores (on a 2-core host, two replicas of two threads each
    served 26-32% fewer tokens a second than of one each: ``graphflow bench serve --model
    smollm2-135m --workflows 1,4 --threads 2`` against ``--threads 1`` at b8904d0).
    ``node_cpus``: each alive node's CPUs, in ``spread`` order. Without ``spread`` on a cluster
    of several nodes Ray chooses where each replica goes, so each gets 0 there (every core of
    its host)."""
    if want.threads:
        return [want.threads] * want.replicas
    if want.spread and node_cpus:
        nodes = len(node_cpus)
        on = [len(range(i, want.replicas, nodes)) for i in range(nodes)]
        return [max(1, int(node_cpus[i % nodes]) // on[i % nodes]) for i in range(want.replicas)]
    if len(node_cpus) == 1:
        return [max(1, int(node_cpus[0]) // want.replicas)] * want.replicas
    return [0] * want.replicas


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _replicas_on(gpus: float, need: float) -> int:
    """Replicas of ``need`` GPUs one node of ``gpus`` GPUs holds (fractions pack within a GPU)."""
    if need < 1:
        return int(gpus + 1e-9) * int(1 / need + 1e-9)
    return int(gpus / need + 1e-9)


@dataclass(frozen=True, slots=True)
class Deployment:
    """What a deployment serves; kept on its board so a second ``serve`` can tell."""

    model: str
    replicas: int
    kv_mode: str = "exact"
    capacity_bytes: int = 1 << 30
    transport: str = "ucx"
    device: str = "cpu"
    gpus_per_replica: float = 0.0
    recompute_head: int = 12  # differential: template tokens recomputed after the prefix, not rebuilt
    threads: int = 0  # torch threads per replica (0: each node's CPUs shared by its replicas, replica_threads)
    prefault_bytes: int = 0  # memory each replica faults in at start for KV it receives (0: on demand)
    spread: bool = False  # replicas round-robin over the cluster's nodes, the manager on the head
    batching: bool = True  # each replica's nodes share forward passes (runtime.batcher); off: one at a time
    max_batch_tokens: int = MAX_BATCH_TOKENS  # tokens per engine step (decodes + prefill chunks)
    templates: str = "short"  # the operation templates clients compile workflows with (short | detailed)
    recompute_fraction: float = 0.0  # differential: at least this fraction of each template recomputed
    memory_price: float = 0.0  # seconds placement charges per GiB of KV a decision adds to a replica (0: time only)
    linear_kernel: str = "auto"  # auto | torch | onednn: what replicas' linear layers run on

    def __post_init__(self) -> None:
        if self.recompute_head < 0:
            raise ValueError(f"recompute_head must be non-negative, got {self.recompute_head}")
        if not 0 <= self.recompute_fraction <= 1:
            raise ValueError(f"--recompute-fraction must lie in [0, 1], got {self.recompute_fraction}")
        if self.replicas <= 0:
            raise ValueError(f"need at least one replica, got {self.replicas}")
        if self.capacity_bytes <= 0:
            raise ValueError(
                f"a replica's KV store needs room: give --capacity-mib of at least 1, got {self.capacity_bytes} bytes"
            )
        if self.transport not in TRANSPORTS:
            raise ValueError(
                f"unknown transport {self.transport!r} for served replicas; use one of {', '.join(TRANSPORTS)}"
            )
        check_device(self.device)
        if self.device.startswith("cuda") and self.gpus_per_replica <= 0:
            raise ValueError(
                "a cuda deployment needs gpus_per_replica > 0 (--gpus-per-replica) so Ray places each replica on a GPU"
            )
        if self.threads < 0:
            raise ValueError(
                f"--threads must be 0 (each node's CPUs shared by its replicas) or more, got {self.threads}"
            )
        if self.prefault_bytes < 0:
            raise ValueError(f"the receive memory to prefault must be 0 bytes or more, got {self.prefault_bytes}")
        if self.gpus_per_replica < 0:
            raise ValueError(f"gpus_per_replica must be non-negative, got {self.gpus_per_replica}")
        if self.batching and self.max_batch_tokens <= BATCH_ROWS:
            raise ValueError(
                f"--max-batch-tokens must exceed {BATCH_ROWS} (a step holds every running decode), "
                f"got {self.max_batch_tokens}"
            )
        if not 0 <= self.memory_price < float("inf"):
            raise ValueError(
                f"--memory-price must be a finite number of seconds per GiB, 0 or more, got {self.memory_price}"
            )
        check_linear_kernel(self.linear_kernel)
        kv_mode_of(self.kv_mode)  # a clear error here rather than from inside every actor
        template_set(self.templates)

    def describe(self) -> str:
        threads = f"{self.threads} threads" if self.threads else "each node's cores shared by its replicas"
        spread = ", spread over nodes" if self.spread else ""
        batching = f"batching {self.max_batch_tokens} tokens/step" if self.batching else "no batching"
        price = f", memory priced {self.memory_price:g} s/GiB" if self.memory_price else ""
        return (
            f"{self.replicas} × {self.model} ({self.kv_mode} KV, {self.capacity_bytes >> 20} MiB each, "
            f"{self.prefault_bytes >> 20} MiB prefaulted, {self.transport}, {self.device}, {threads}, "
            f"{batching}{spread}, {self.templates} templates{price}, linear layers {self.linear_kernel})"
        )

    def lam_s_per_byte(self) -> float:
        """The placement's memory term λ (seconds per byte of new KV) this deployment's price sets."""
        return self.memory_price / (1 << 30)
