"""Ray object-store transport between two Ray worker processes."""

from __future__ import annotations

import pytest
import torch

from graphflow.checks.transfer import TransferCheck, run_transfer_check

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_cluster():
    from graphflow.runtime.cluster import shutdown, start_local

    ray = start_local(num_cpus=2)
    yield ray
    shutdown()


def test_ray_kv_state_between_processes(ray_cluster):
    result = run_transfer_check("ray", TransferCheck(tokens=200), timeout_s=60)
    assert result["processes"] == 2
    assert result["tokens_equal"] is True and result["max_abs_logit_diff"] == 0.0


def send_and_report(name: str, peer: str) -> str:
    from transport.base import TransferSpec, TransportConfig
    from transport.ray_store import RayTransport
    from transport.wire import BlockHeader, checksum

    t = torch.ones(1 << 20, dtype=torch.uint8)
    headers = [BlockHeader(1, 0, 0, (), "uint8", (1 << 20,), 1 << 20, checksum(t))]
    RayTransport(TransportConfig(timeout_s=10), name=name).send(
        TransferSpec.for_headers(9, peer, headers), headers, [t]
    )
    return "sent"


def receive_outcome(name: str, peer: str, timeout_s: float) -> str:
    from transport.base import TransferSpec, TransportConfig
    from transport.ray_store import RayTransport

    try:
        RayTransport(TransportConfig(timeout_s=timeout_s), name=name).recv(TransferSpec(9, peer, (1,), (1 << 20,)))
        return "received"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return type(exc).__name__


def test_ray_sender_gone_before_receive_never_hangs(ray_cluster):
    """The sender posts its transfer and is killed before the receiver fetches it. The blocks
    may survive in the object store (then they arrive checksum-verified) or be lost with their
    owner (then it is a TransportError); either way the receiver finishes within its deadline."""
    from graphflow.runtime.actors import call_worker

    ray = ray_cluster
    sender, receiver = call_worker(ray, num_cpus=0), call_worker(ray, num_cpus=0)
    assert ray.get(sender.call.remote(f"{__name__}:send_and_report", "s-gone", "r-gone")) == "sent"
    ray.kill(sender)  # the owner of the posted objects dies before they are fetched
    outcome = ray.get(receiver.call.remote(f"{__name__}:receive_outcome", "r-gone", "s-gone", 10.0), timeout=60)
    assert outcome in ("received", "TransportError", "TransferTimeout")


def test_ray_missing_sender_times_out(ray_cluster):
    from graphflow.runtime.actors import call_worker

    receiver = call_worker(ray_cluster, num_cpus=0)
    outcome = ray_cluster.get(receiver.call.remote(f"{__name__}:receive_outcome", "r-lonely", "s-none", 2.0))
    assert outcome == "TransferTimeout"
