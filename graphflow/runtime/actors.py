"""Thin Ray actor shells around plain classes (the only runtime module that defines actors)."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CallWorker", "call_worker"]


class CallWorker:
    """A process that runs a named plain function; used for two-process checks on Ray."""

    def call(self, target: str, *args: Any, **kwargs: Any) -> Any:
        module, name = target.split(":")
        return getattr(importlib.import_module(module), name)(*args, **kwargs)


def call_worker(ray: Any, **options: Any) -> Any:
    """A new ``CallWorker`` actor (``options`` go to ``.options()``, e.g. ``num_cpus``)."""
    return ray.remote(CallWorker).options(**options).remote()
