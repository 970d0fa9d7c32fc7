"""Cross-memory attach on this very process (no second process, no sockets)."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from transport import cma

pytestmark = pytest.mark.skipif(not cma.available(), reason="cross-memory attach needs Linux")


def test_write_then_read_back_through_the_kernel():
    src = np.arange(1 << 16, dtype=np.uint32)
    dst = np.zeros_like(src)
    cma.write(os.getpid(), dst.ctypes.data, src.ctypes.data, src.nbytes)
    assert np.array_equal(dst, src)
    assert cma.read(os.getpid(), dst.ctypes.data, 8) == src[:2].tobytes()


def test_unmapped_address_is_an_error_not_a_crash():
    src = np.ones(16, np.uint8)
    with pytest.raises(cma.CrossMemoryError, match="cannot write to process"):
        cma.write(os.getpid(), 8, src.ctypes.data, 16)


def test_cookie_is_reachable_only_with_its_own_bytes():
    cookie = cma.Cookie()
    assert cma.Cookie.reachable(cookie.pid, cookie.address, cookie.value)
    assert not cma.Cookie.reachable(cookie.pid, cookie.address, bytes(a ^ 1 for a in cookie.value))
    assert not cma.Cookie.reachable(2**22 + 17, cookie.address, cookie.value)  # NOTE: above pid_max's default
    assert ctypes.string_at(cookie.address, cma.Cookie.NBYTES) == cookie.value
