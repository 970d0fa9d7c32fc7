"""A kept byte buffer that transient tensors are viewed from, grown to the largest asked for.

Used where one transient at a time is enough and allocating it anew each time would grow the
heap (``ragged``: gathering a shared prefix's layer). The caller makes sure one view is done
with before the next is taken.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["ScratchBuffer"]


class ScratchBuffer:
    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None

    def view(self, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        """An uninitialised contiguous tensor of ``shape`` (``like``'s dtype and device) over
        the buffer, which is replaced by a larger one when it is too small."""
        nbytes = math.prod(int(d) for d in shape) * like.element_size()
        buf = self._buffer
        if buf is None or buf.numel() < nbytes or buf.device != like.device:
            buf = self._buffer = torch.empty(nbytes, dtype=torch.uint8, device=like.device)
        return buf[:nbytes].view(like.dtype).view(tuple(int(d) for d in shape))
