"""Transfer ids, without torch (clients that only plan transfers never load it)."""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterator

__all__ = ["transfer_ids"]


def transfer_ids() -> Iterator[int]:
    """Transfer ids for one client process: consecutive from a random 48-bit start, so two
    processes driving the same pair of replicas do not reuse each other's ids."""
    return itertools.count(secrets.randbits(48))
