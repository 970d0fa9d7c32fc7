"""Cross-memory attach: one process writes straight into another same-host process's memory.

Linux ``process_vm_writev``/``process_vm_readv`` copy between address spaces in one kernel
call, with the permission of ``ptrace`` (same user; Yama's ``ptrace_scope`` and seccomp may
forbid it, and then both calls fail with ``EPERM``/``ENOSYS``). Open MPI's and UCX's
shared-memory paths use the same calls, with the *receiver* reading; here the *sender*
writes, so the receiver's core is free to verify one message while the next one is written
(see :mod:`transport.mpi`).

Addresses are only trusted after a :class:`Cookie` check: a process publishes the address of
16 random bytes; a peer that reads exactly those bytes back at that address of that pid is
talking to that very process (a pid on another host, or a recycled pid, reads something
else or fails), and only then writes there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import secrets
import sys

__all__ = ["Cookie", "CrossMemoryError", "available", "read", "write"]


class CrossMemoryError(OSError):
    """A cross-memory read or write failed (peer gone, not permitted, bad address)."""


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _bind() -> tuple[object, object] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fns = libc.process_vm_readv, libc.process_vm_writev
    except (OSError, AttributeError):
        return None
    vec = ctypes.POINTER(_IoVec)
    for fn in fns:
        fn.argtypes = [ctypes.c_int, vec, ctypes.c_ulong, vec, ctypes.c_ulong, ctypes.c_ulong]
        fn.restype = ctypes.c_ssize_t
    return fns


_CALLS = _bind()


def available() -> bool:
    """Whether this platform has the calls at all (permission is only known by trying)."""
    return _CALLS is not None


def _move(index: int, pid: int, local_ptr: int, remote_ptr: int, nbytes: int) -> None:
    if _CALLS is None:
        raise CrossMemoryError(errno.ENOSYS, "cross-memory attach needs Linux process_vm_readv/writev")
    call = _CALLS[index]
    done = 0
    while done < nbytes:  # NOTE: the kernel may move fewer bytes than asked (e.g. at a page it cannot map)
        local = _IoVec(local_ptr + done, nbytes - done)
        remote = _IoVec(remote_ptr + done, nbytes - done)
        moved = call(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)  # type: ignore[operator]
        if moved <= 0:
            err = ctypes.get_errno() or errno.EIO
            what = "write to" if index else "read from"
            raise CrossMemoryError(err, f"cannot {what} process {pid} at {remote_ptr + done:#x}: {os.strerror(err)}")
        done += moved


def write(pid: int, remote_ptr: int, local_ptr: int, nbytes: int) -> None:
    """Copy ``nbytes`` from this process's ``local_ptr`` to ``remote_ptr`` in process ``pid``.

    Raises:
        CrossMemoryError: the process is gone, writing to it is not permitted, or the range
            is not mapped there.
    """
    _move(1, pid, local_ptr, remote_ptr, nbytes)


def read(pid: int, remote_ptr: int, nbytes: int) -> bytes:
    """``nbytes`` read from ``remote_ptr`` in process ``pid`` (raises :class:`CrossMemoryError`)."""
    buf = ctypes.create_string_buffer(nbytes)
    _move(0, pid, ctypes.addressof(buf), remote_ptr, nbytes)
    return buf.raw


class Cookie:
    """16 random bytes at a fixed address in this process, for peers to prove they can reach it."""

    NBYTES = 16

    def __init__(self) -> None:
        self.value = secrets.token_bytes(self.NBYTES)
        self._buf = ctypes.create_string_buffer(self.value, self.NBYTES)
        self.pid = os.getpid()

    @property
    def address(self) -> int:
        return ctypes.addressof(self._buf)

    @staticmethod
    def reachable(pid: int, address: int, value: bytes) -> bool:
        """Whether ``value`` can be read back at ``address`` in process ``pid``."""
        try:
            return read(pid, address, len(value)) == value
        except CrossMemoryError:
            return False
