"""Which UCX transports an endpoint uses: ``ucp_ep_query`` with ``UCP_EP_ATTR_FIELD_TRANSPORTS``.

UCXX exposes the endpoint handle (``ucp_ep_h``) but not this query, so it is called through
ctypes on the ``libucp`` that UCXX itself loaded (found in ``/proc/self/maps``, so a second
libucp on the path, such as Open MPI's, is never picked up). The answer names transport and
device per lane: ``tcp/eth0`` across hosts, ``sysv/memory`` and ``cma/memory`` between
processes of one host, ``self/memory`` for a process's own worker.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path
from typing import cast

__all__ = ["endpoint_transports", "loaded_libucp"]

_FIELD_TRANSPORTS = 1 << 3  # UCP_EP_ATTR_FIELD_TRANSPORTS (ucp.h)
_NAME_MAX = 32  # UCP_ENTITY_NAME_MAX (ucp_def.h)
_SOCKADDR_STORAGE = 128
_MAX_LANES = 16


class _Entry(ctypes.Structure):  # ucp_transport_entry_t
    _fields_ = [("transport_name", ctypes.c_char_p), ("device_name", ctypes.c_char_p)]


class _Transports(ctypes.Structure):  # ucp_transports_t
    _fields_ = [
        ("entries", ctypes.POINTER(_Entry)),
        ("num_entries", ctypes.c_uint),
        ("entry_size", ctypes.c_size_t),
    ]


class _EpAttr(ctypes.Structure):  # ucp_ep_attr_t
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("name", ctypes.c_char * _NAME_MAX),
        ("local_sockaddr", ctypes.c_uint64 * (_SOCKADDR_STORAGE // 8)),
        ("remote_sockaddr", ctypes.c_uint64 * (_SOCKADDR_STORAGE // 8)),
        ("transports", _Transports),
        ("user_data", ctypes.c_void_p),
    ]


def loaded_libucp() -> str:
    """Path of the ``libucp`` mapped into this process ("" when none is)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "/libucp.so" in path:
            return path
    return ""


@functools.cache
def _ep_query() -> Callable[..., int] | None:
    path = loaded_libucp()
    if not path:
        return None
    fn = ctypes.CDLL(path).ucp_ep_query
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(_EpAttr)]
    fn.restype = ctypes.c_int
    return cast(Callable[..., int], fn)


def endpoint_transports(handle: int) -> tuple[str, ...]:
    """``transport/device`` of each lane of the UCP endpoint ``handle``, duplicates removed, in
    lane order; ``()`` when UCX is not loaded or the query fails."""
    query = _ep_query()
    if query is None or not handle:
        return ()
    entries = (_Entry * _MAX_LANES)()
    attr = _EpAttr(field_mask=_FIELD_TRANSPORTS)
    attr.transports.entries = ctypes.cast(entries, ctypes.POINTER(_Entry))
    attr.transports.num_entries = _MAX_LANES
    attr.transports.entry_size = ctypes.sizeof(_Entry)
    if query(ctypes.c_void_p(handle), ctypes.byref(attr)) != 0:  # UCS_OK
        return ()
    seen: dict[str, None] = {}
    for e in entries[: min(attr.transports.num_entries, _MAX_LANES)]:
        seen[f"{(e.transport_name or b'?').decode()}/{(e.device_name or b'?').decode()}"] = None
    return tuple(seen)
