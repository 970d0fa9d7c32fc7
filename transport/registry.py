"""Backend registry with lazy imports: ``create("ucx")`` imports UCXX only when asked."""

from __future__ import annotations

import importlib
from typing import Any

from transport.base import Transport, TransportConfig

__all__ = ["BACKENDS", "create"]

BACKENDS: dict[str, str] = {
    "local": "transport.local:LocalTransport",
    "ucx": "transport.ucx:UcxTransport",
    "mpi": "transport.mpi:MpiTransport",
    "ray": "transport.ray_store:RayTransport",
}


def create(backend: str, config: TransportConfig | None = None, **kwargs: Any) -> Transport:
    """Instantiate a backend by name; unknown names raise ``ValueError`` listing the known ones."""
    try:
        module_name, cls_name = BACKENDS[backend].split(":")
    except KeyError:
        raise ValueError(f"unknown transport backend {backend!r}; known: {', '.join(BACKENDS)}") from None
    cls = getattr(importlib.import_module(module_name), cls_name)
    transport: Transport = cls(config, **kwargs)
    return transport
