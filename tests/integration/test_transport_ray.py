"""Ray object-store transport between two Ray worker processes."""

from __future__ import annotations

import time

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
    assert result.processes == 2
    assert result.received.tokens_equal is True and result.received.max_abs_logit_diff == 0.0


def send_and_report(name: str, peer: str) -> str:
    from transport.base import TransferSpec, TransportConfig
    from transport.checksums import checksum
    from transport.ray_store import RayTransport
    from transport.wire import BlockHeader

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


def test_ray_sender_gone_before_receive_never_waits_out_the_deadline(ray_cluster):
    """The sender posts its transfer and is killed (and seen dead) before the receiver fetches
    it. Ray 2.60 here still serves the posted blocks from its object store (they then arrive
    checksum-verified); if it ever reports them lost with their owner, that is a
    TransportError. Either way the receiver knows at once: it never waits for its deadline."""
    from graphflow.runtime.actors import call_worker

    ray = ray_cluster
    sender, receiver = call_worker(ray, num_cpus=0), call_worker(ray, num_cpus=0)
    assert ray.get(sender.call.remote(f"{__name__}:send_and_report", "s-gone", "r-gone")) == "sent"
    ray.kill(sender)  # the owner of the posted objects dies before they are fetched
    _wait_dead(ray, sender)  # NOTE: ray.kill returns at once; a receive before the death would still succeed
    begin = time.monotonic()
    outcome = ray.get(receiver.call.remote(f"{__name__}:receive_outcome", "r-gone", "s-gone", 10.0), timeout=60)
    assert outcome in ("received", "TransportError") and time.monotonic() - begin < 10.0


def _wait_dead(ray, actor, timeout_s: float = 30.0) -> None:
    from ray.exceptions import RayActorError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except RayActorError:
            return
        time.sleep(0.1)
    raise AssertionError(f"the killed actor still answered after {timeout_s:g} s")


def test_ray_missing_sender_times_out(ray_cluster):
    from graphflow.runtime.actors import call_worker

    receiver = call_worker(ray_cluster, num_cpus=0)
    outcome = ray_cluster.get(receiver.call.remote(f"{__name__}:receive_outcome", "r-lonely", "s-none", 2.0))
    assert outcome == "TransferTimeout"


def send_outcome(name: str, peer: str) -> str:
    try:
        return send_and_report(name, peer)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return f"{type(exc).__name__}: {exc}"


def test_ray_sender_after_the_receiver_gave_up_is_refused(ray_cluster):
    """A receiver whose deadline passed has given up; a sender posting afterwards is told so
    (its blocks are not left pinned in the mailbox)."""
    from graphflow.runtime.actors import call_worker

    worker = call_worker(ray_cluster, num_cpus=0)
    assert ray_cluster.get(worker.call.remote(f"{__name__}:receive_outcome", "r-late", "s-late", 1.0)) == (
        "TransferTimeout"
    )
    outcome = ray_cluster.get(worker.call.remote(f"{__name__}:send_outcome", "s-late", "r-late"))
    assert outcome.startswith("TransportError") and "gave up" in outcome
