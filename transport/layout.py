"""How a transfer is cut into data messages: part of the wire format (version 2).

Both sides compute the cut from the block sizes alone, so a receiver can post its receives
before the header arrives, and block memory (:mod:`transport.memory`) is laid out in the same
spans, so that a message is sent from and received into place.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MESSAGE_BYTES", "message_runs", "message_spans"]

MESSAGE_BYTES = 8 << 20


def message_runs(nbytes: Sequence[int], max_message_bytes: int = MESSAGE_BYTES) -> list[range]:
    """The blocks each data message carries: consecutive blocks, greedily, up to
    ``max_message_bytes`` per message (a bigger block travels alone). A pure function of the
    sizes, so sender and receiver agree on it before the header arrives.
    """
    if max_message_bytes <= 0:
        raise ValueError(f"max_message_bytes must be positive, got {max_message_bytes}")
    runs: list[range] = []
    lo, run_bytes = 0, 0
    for i, n in enumerate(nbytes):
        if i > lo and run_bytes + n > max_message_bytes:
            runs.append(range(lo, i))
            lo, run_bytes = i, 0
        run_bytes += n
    if len(nbytes) > lo:
        runs.append(range(lo, len(nbytes)))
    return runs


def message_spans(nbytes: Sequence[int], max_message_bytes: int = MESSAGE_BYTES) -> list[tuple[range, int, int]]:
    """Each data message's blocks (:func:`message_runs`) with where its bytes start and how
    many there are, when the blocks lie back to back from offset 0."""
    spans, lo = [], 0
    for run in message_runs(nbytes, max_message_bytes):
        n = sum(nbytes[i] for i in run)
        spans.append((run, lo, n))
        lo += n
    return spans
