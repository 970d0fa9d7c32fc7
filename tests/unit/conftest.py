"""Unit tests never start Ray: make any attempt fail loudly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from graphflow.client import Client, calibrate_cluster
from graphflow.runtime.executor import WorkflowExecutor
from graphflow.runtime.local import LocalCluster


@pytest.fixture(autouse=True)
def _forbid_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        import ray
    except ImportError:
        return

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("unit tests must not start Ray; move this test to tests/integration")

    monkeypatch.setattr(ray, "init", refuse)


@pytest.fixture(scope="module")
def local_client() -> Iterator[Client]:
    """A calibrated client over two in-process tiny-llama replicas (no Ray), one per module."""
    cluster = LocalCluster("tiny-llama", replicas=2)
    cal = calibrate_cluster(cluster)
    yield Client(cluster, WorkflowExecutor(cluster, cal.policy, cal.links, cal.kv_bytes_per_token, cal.model_key, 2))
    cluster.close()
