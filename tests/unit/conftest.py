"""Unit tests never start Ray: make any attempt fail loudly."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _forbid_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        import ray
    except ImportError:
        return

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("unit tests must not start Ray; move this test to tests/integration")

    monkeypatch.setattr(ray, "init", refuse)
