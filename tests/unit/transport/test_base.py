from __future__ import annotations

import pytest
import torch

from transport.base import TransferSpec, check_into
from transport.local import LocalTransport

from .test_wire import _header


def _blocks():
    tensors = [torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(2, 8, dtype=torch.bfloat16)]
    headers = [_header(t, key=i + 1, dtype="bfloat16", nbytes=t.numel() * 2) for i, t in enumerate(tensors)]
    return headers, tensors


def test_check_into_accepts_tensors_that_fit():
    headers, tensors = _blocks()
    into = [torch.empty_like(t) for t in tensors]
    assert check_into(headers, into) == into


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (torch.empty(4, 4, dtype=torch.bfloat16), "does not fit"),  # same bytes, other shape
        (torch.empty(2, 8, dtype=torch.float16), "does not fit"),  # same shape, other dtype
        (torch.empty(8, 2, dtype=torch.bfloat16).t(), "does not fit"),  # not contiguous
        (torch.empty(2, 8, dtype=torch.bfloat16, device="meta"), "must be CPU tensors"),
    ],
)
def test_check_into_rejects_a_tensor_that_does_not_fit(bad, match):
    headers, tensors = _blocks()
    with pytest.raises(ValueError, match=match):
        check_into(headers, [torch.empty_like(tensors[0]), bad])


def test_check_into_counts_the_tensors():
    headers, tensors = _blocks()
    with pytest.raises(ValueError, match="1 receive tensors for 2 blocks"):
        check_into(headers, tensors[:1])


def test_receive_tensors_are_checked_against_the_spec_before_anything_is_posted():
    headers, tensors = _blocks()
    endpoint = LocalTransport()
    try:
        spec = TransferSpec.for_headers(1, "nobody", headers)
        with pytest.raises(ValueError, match="do not match the sizes"):
            endpoint.recv(spec, into=[torch.empty(3, dtype=torch.bfloat16), torch.empty_like(tensors[1])])
        with pytest.raises(ValueError, match="contiguous CPU tensors"):
            endpoint.recv(spec, into=[torch.empty(8, 2, dtype=torch.bfloat16).t(), torch.empty_like(tensors[1])])
    finally:
        endpoint.close()
