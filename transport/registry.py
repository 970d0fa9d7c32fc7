"""Backend registry with lazy imports: ``create("ucx")`` imports UCXX only when asked."""

from __future__ import annotations

import importlib
from typing import Any

from transport.base import Transport, TransportConfig

__all__ = ["BACKENDS", "check_backend", "create"]

BACKENDS: dict[str, str] = {
    "local": "transport.local:LocalTransport",
    "ucx": "transport.ucx:UcxTransport",
    "mpi": "transport.mpi:MpiTransport",
    "ray": "transport.ray_store:RayTransport",
}


def check_backend(backend: str) -> None:
    """Raises ``ValueError`` naming the backends when ``backend`` is none of them (what a command
    checks before it starts anything)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use {', '.join(BACKENDS)}")


def create(backend: str, config: TransportConfig | None = None, **kwargs: Any) -> Transport:
    """Instantiate a backend by name; unknown names raise ``ValueError`` listing the known ones."""
    try:
        module_name, cls_name = BACKENDS[backend].split(":")
    except KeyError:
        raise ValueError(f"unknown transport backend {backend!r}; known: {', '.join(BACKENDS)}") from None
    cls = getattr(importlib.import_module(module_name), cls_name)
    transport: Transport = cls(config, **kwargs)
    return transport
