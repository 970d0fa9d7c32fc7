"""What a deployment serves: checked before anything starts, one sentence per mistake."""

from __future__ import annotations

from dataclasses import replace

import pytest

from graphflow.runtime.deployment import Deployment, gpu_shortfall, gpus_for, replica_threads


def test_a_cuda_replica_gets_one_gpu_unless_asked_otherwise():
    assert gpus_for("cuda", None) == 1.0 and gpus_for("cuda:0", None) == 1.0
    assert gpus_for("cpu", None) == 0.0
    assert gpus_for("cuda", 0.5) == 0.5 and gpus_for("cpu", 2.0) == 2.0


def test_a_cuda_deployment_without_gpus_is_refused():
    with pytest.raises(ValueError, match="gpus_per_replica > 0"):
        Deployment("tiny-llama", 2, device="cuda")
    assert Deployment("tiny-llama", 2, device="cuda", gpus_per_replica=gpus_for("cuda", None)).gpus_per_replica == 1.0


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"replicas": 0}, "at least one replica"),
        ({"transport": "mpi"}, "unknown transport 'mpi'"),
        ({"device": "tpu"}, "device must be cpu or cuda"),
        ({"gpus_per_replica": -1.0}, "non-negative"),
        ({"threads": -1}, "--threads must be 0 .* or more, got -1"),
        ({"prefault_bytes": -1}, "prefault must be 0 bytes or more, got -1"),
        ({"max_batch_tokens": 4}, "--max-batch-tokens must exceed"),
        ({"recompute_fraction": 1.5}, "--recompute-fraction"),
        ({"linear_kernel": "mkl"}, "unknown linear kernel 'mkl'; use one of auto, torch, onednn"),
    ],
)
def test_bad_settings_are_refused_with_what_to_change(settings, says):
    with pytest.raises(ValueError, match=says):
        Deployment(**{"model": "tiny-llama", "replicas": 2, **settings})


def test_describe_names_what_runs():
    text = Deployment("tiny-llama", 2, threads=1).describe()
    assert text.startswith("2 × tiny-llama (exact KV") and "1 threads" in text and "ucx" in text
    assert text.endswith("linear layers auto)")


def test_replicas_that_no_node_has_gpus_for_are_refused_before_anything_starts():
    cuda = Deployment("tiny-llama", 2, device="cuda", gpus_per_replica=1.0)
    assert "could never start" in gpu_shortfall(cuda, [0.0])  # a CPU-only host: Ray would wait forever
    assert "--device cpu" in gpu_shortfall(cuda, [0.0])
    assert gpu_shortfall(cuda, [2.0]) == ""
    assert gpu_shortfall(cuda, [1.0, 1.0]) == ""  # Ray places them on either node
    assert "(1 replica could never start)" in gpu_shortfall(cuda, [1.0])
    half = replace(cuda, replicas=4, gpus_per_replica=0.5)
    assert gpu_shortfall(half, [2.0]) == ""  # two replicas share each GPU
    assert gpu_shortfall(replace(half, replicas=5), [2.0]) != ""
    spread = replace(cuda, replicas=3, spread=True)  # node i mod 2: two on the first node
    assert gpu_shortfall(spread, [2.0, 1.0]) == ""
    assert "(1 replica could never start)" in gpu_shortfall(spread, [1.0, 2.0])
    assert gpu_shortfall(Deployment("tiny-llama", 2), [0.0]) == ""  # cpu replicas take no GPU


@pytest.mark.parametrize("mib", [0, -1])
def test_a_replica_store_without_room_is_refused(mib):
    with pytest.raises(ValueError, match="capacity-mib of at least 1"):
        Deployment("tiny-llama", 1, capacity_bytes=mib << 20)


@pytest.mark.parametrize("price", [-1.0, float("inf"), float("nan")])
def test_a_memory_price_that_is_not_a_finite_non_negative_number_is_refused(price):
    with pytest.raises(ValueError, match="--memory-price must be a finite number"):
        Deployment("tiny-llama", 2, memory_price=price)


def test_the_memory_price_is_the_placement_lambda_per_byte():
    priced = Deployment("tiny-llama", 2, memory_price=2.0)
    assert priced.lam_s_per_byte() == 2.0 / 2**30 and "memory priced 2 s/GiB" in priced.describe()
    assert Deployment("tiny-llama", 2).lam_s_per_byte() == 0.0


def test_replicas_share_their_nodes_cpus_unless_threads_are_given():
    assert replica_threads(Deployment("tiny-llama", 2), [2.0]) == [1, 1]  # this 2-core host: one each
    assert replica_threads(Deployment("tiny-llama", 2), [16.0]) == [8, 8]
    assert replica_threads(Deployment("tiny-llama", 3), [2.0]) == [1, 1, 1]  # never none
    assert replica_threads(Deployment("tiny-llama", 1), [2.0]) == [2]
    assert replica_threads(Deployment("tiny-llama", 2, threads=3), [2.0]) == [3, 3]  # asked for: kept
    # spread: replica i on node i mod N, each node's CPUs shared by the replicas it gets
    assert replica_threads(Deployment("tiny-llama", 3, spread=True), [8.0, 4.0]) == [4, 4, 4]
    assert replica_threads(Deployment("tiny-llama", 2, spread=True), [8.0, 4.0]) == [8, 4]
    # several nodes, not spread: Ray picks each replica's node, so each takes its host's every core
    assert replica_threads(Deployment("tiny-llama", 2), [8.0, 4.0]) == [0, 0]
