from __future__ import annotations

import pytest

from graphflow.bench.transport import parse_size
from transport.local import LocalTransport
from transport.registry import BACKENDS, check_backend, create


def test_create_local_and_unknown():
    t = create("local")
    assert isinstance(t, LocalTransport)
    t.close()
    with pytest.raises(ValueError, match="known: local, ucx, mpi, ray"):
        create("carrier-pigeon")
    assert set(BACKENDS) == {"local", "ucx", "mpi", "ray"}


def test_parse_size():
    assert parse_size("1MiB") == 1 << 20
    assert parse_size("256MiB") == 256 << 20
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError, match="cannot read size"):
        parse_size("lots")
    with pytest.raises(ValueError, match="under one byte"):
        parse_size("0")
    with pytest.raises(ValueError, match="under one byte"):
        parse_size("0.1b")


def test_check_backend_accepts_each_registered_backend() -> None:
    for backend in ("local", "ucx", "mpi", "ray"):
        check_backend(backend)
    with pytest.raises(ValueError, match="unknown backend 'UCX'"):
        check_backend("UCX")
