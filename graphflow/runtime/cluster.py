"""Start an embedded local Ray, or connect to a cluster, with token auth handled.

Ray 2.60 starts local clusters with token authentication on; a Ray *client* connection
(``ray://``) fails unless ``RAY_AUTH_MODE=token`` is set for both head and client. We set it
for everything we start and explain it when a connection is refused.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["connect", "shutdown", "start_local"]


def _ray() -> Any:
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray

    return ray


def start_local(num_cpus: int | None = None, namespace: str = "graphflow") -> Any:
    """Start (or reuse) an embedded single-machine Ray; returns the ``ray`` module."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(
            num_cpus=num_cpus,
            namespace=namespace,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    return ray


def connect(address: str, namespace: str = "graphflow") -> Any:
    """Connect to an existing cluster (``auto``, ``host:port`` or ``ray://host:10001``)."""
    ray = _ray()
    if ray.is_initialized():
        return ray
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False)
    except ConnectionError as exc:
        raise ConnectionError(
            f"could not connect to Ray at {address}: {exc}. Ray 2.60 clusters use token auth: set "
            "RAY_AUTH_MODE=token for both the head (ray start) and this client"
        ) from None
    return ray


def shutdown() -> None:
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()
