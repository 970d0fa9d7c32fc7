"""How to rebuild a recorded state on a replica, read off where its blocks are now.

A pure function over the state's block keys and a ``locate`` answer per key (the replicas
holding a live copy): runs of leading blocks the replica still holds are reused, runs another
replica holds are transferred from it (one source per run), and from the first block no replica
holds everything is recomputed, since a prefill rebuilds every later block anyway::

    blocks   [ 0 ][ 1 ][ 2 ][ 3 ][ 4 ]      held on:  r1  r1  r0  -   r0
    steps    └ reuse r1 ┘└ xfer r0 ┘└ recompute ───┘

The manager (``KVStateManager.recovery_plan``) supplies the keys, the locations and the
lineage; the caller carries the plan out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from graphflow.kv.events import RecoveryPlan, RecoveryStep

__all__ = ["plan_recovery"]


def plan_recovery(
    state_id: str,
    replica: str,
    block_keys: Sequence[int],
    num_tokens: int,
    block_tokens: int,
    locate: Callable[[int], Sequence[str]],
    lineage: Sequence[str] = (),
) -> RecoveryPlan:
    """The steps that rebuild ``state_id`` (``block_keys``, ``num_tokens`` tokens, blocks of
    ``block_tokens``) on ``replica``; ``locate(key)`` lists the replicas holding that block."""
    tokens_at = [0] + [min(lo + block_tokens, num_tokens) for lo in range(0, num_tokens, block_tokens)]
    steps: list[RecoveryStep] = []
    i, n = 0, len(block_keys)
    while i < n:
        holders = locate(block_keys[i])
        if replica in holders:
            action, source = "reuse", replica
        elif holders:
            action, source = "transfer", holders[0]
        else:
            action, source = "recompute", ""
        j = n if action == "recompute" else i + 1
        while j < n and _same_source(locate(block_keys[j]), action, replica, source):
            j += 1
        steps.append(RecoveryStep(action, replica, source, (i, j), (tokens_at[i], tokens_at[j])))
        i = j
    return RecoveryPlan(state_id, replica, tuple(steps), tuple(lineage))


def _same_source(holders: Sequence[str], action: str, replica: str, source: str) -> bool:
    """Whether a block held on ``holders`` continues the current run (reuse, or one transfer source)."""
    return replica in holders if action == "reuse" else (replica not in holders and source in holders)
