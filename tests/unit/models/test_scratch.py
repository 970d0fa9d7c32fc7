"""The kept scratch buffer: views of one buffer, replaced only when too small."""

from __future__ import annotations

import torch

from graphflow.models.scratch import ScratchBuffer


def test_views_reuse_the_buffer_until_a_larger_one_is_needed():
    s, like = ScratchBuffer(), torch.zeros(1, dtype=torch.float32)
    a = s.view((4, 8), like)
    b = s.view((2, 3), like)
    assert a.shape == (4, 8) and b.shape == (2, 3) and b.dtype == torch.float32 and b.is_contiguous()
    assert b.data_ptr() == a.data_ptr()
    c = s.view((16, 8), like)
    assert c.numel() == 128 and s.view((4, 8), like).data_ptr() == c.data_ptr()
