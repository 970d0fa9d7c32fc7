"""GraphFlow: distributed serving of LLM-agent workflows with the KV cache as a first-class object."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "connect"]

if TYPE_CHECKING:
    from graphflow.client import Client


def connect(address: str | None = None, **kwargs: Any) -> Client:
    """``graphflow.connect("ray://host:10001")`` → a client (see ``graphflow.client``)."""
    from graphflow.client import connect as _connect

    return _connect(address, **kwargs)
