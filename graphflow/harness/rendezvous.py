"""Address exchange between two processes through a shared folder (tests, checks, benchmarks).

In the running system the KV manager carries endpoint addresses; a pair of standalone
processes uses this instead: each writes its address atomically and waits for the other's.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["exchange_addresses", "write_result"]


def exchange_addresses(folder: Path, role: int, address: str, timeout_s: float = 120.0) -> str:
    """Publish ``address`` as ``role`` (0 or 1) and return the other role's address."""
    if role not in (0, 1):
        raise ValueError(f"role must be 0 or 1, got {role}")
    mine, theirs = folder / f"addr{role}", folder / f"addr{1 - role}"
    tmp = folder / f".addr{role}"
    tmp.write_text(address)
    tmp.rename(mine)
    deadline = time.monotonic() + timeout_s
    while not theirs.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the peer process did not publish its address in {folder} within {timeout_s:g} s")
        time.sleep(0.01)
    return theirs.read_text()


def write_result(folder: Path, role: int, result: Any) -> None:
    """``folder/result{role}.json``, written atomically (the launcher reads it once the process exits)."""
    tmp = folder / f".result{role}.json"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, folder / f"result{role}.json")
