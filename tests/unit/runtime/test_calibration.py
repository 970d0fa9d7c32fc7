from __future__ import annotations

from graphflow.models.gemm_padding import GemmPadding
from graphflow.runtime.calibration import decode_samples


def test_decode_samples_time_steps_padded_as_the_engine_loop_pads_them(tiny_engine):
    head_rows = []
    hook = tiny_engine.model.lm_head.register_forward_hook(lambda m, args, y: head_rows.append(args[0].shape[-2]))
    try:
        plain = decode_samples(tiny_engine, [(2, 32)], block_tokens=16, steps=1)
        plain_rows, head_rows[:] = list(head_rows), []
        padded = decode_samples(tiny_engine, [(2, 32)], block_tokens=16, steps=1, padding=GemmPadding((1, 4)))
    finally:
        hook.remove()
    assert [(r, c) for r, c, _ in plain + padded] == [(2, 32), (2, 32)] and all(s > 0 for *_, s in plain + padded)
    # the prefix's own prefill runs one row; each timed decode step (one untimed, one timed) runs 2, or 4 padded
    assert plain_rows == [1, 2, 2] and head_rows == [1, 4, 4]
