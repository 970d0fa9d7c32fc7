"""The processes of one Ray head on this machine, so that ``graphflow shutdown`` stops the head
``serve`` started and leaves every other Ray here running (``ray stop`` stops them all), and
``serve`` can tell whether a head it joins runs its client proxy as ``HEAD_ENV`` asks.

A head is known by its GCS port. Its own processes name it in their arguments: the GCS server
(``--gcs_server_port=P``), the raylet, dashboard, log monitor and autoscaler monitor
(``--gcs-address=HOST:P``) and Ray's client proxy (``--address=HOST:P``), each with HOST one of this
machine's addresses (a worker node here of a cluster whose head is elsewhere names that head's
host instead). The rest — Ray's workers (the replicas among them), agents and the per-client servers
— are their descendants. They are killed as ``ray stop --force`` kills every Ray process here (a
head sent SIGTERM here still had two of its processes 11 s later); ``shutdown`` has stopped the
deployment's actors before.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = [
    "HeadProcess",
    "client_proxy_forks_with_grpc_handlers",
    "current_cluster_record",
    "forget_current_cluster",
    "head_processes",
    "local_addresses",
    "names_head",
    "running_processes",
    "stop_processes",
]

_ADDRESS_FLAGS = ("--gcs-address=", "--address=")


@dataclass(frozen=True, slots=True)
class HeadProcess:
    """One process of the head: its pid, its parent's and its arguments."""

    pid: int
    ppid: int
    argv: tuple[str, ...]


def _is_head(endpoint: str, port: int, local: Collection[str]) -> bool:
    """Whether ``endpoint`` (``host:port``) is ``port`` on one of the ``local`` hosts."""
    host, _, p = endpoint.rpartition(":")
    return p == str(port) and host in local


def names_head(argv: Sequence[str], port: int, local: Collection[str]) -> bool:
    """Whether a process with arguments ``argv`` is one of the head at ``port`` on this machine,
    ``local`` being this machine's addresses."""
    for arg in argv:
        if arg == f"--gcs_server_port={port}":
            return "gcs_server" in Path(argv[0]).name
        if any(arg.startswith(f) and _is_head(arg.removeprefix(f), port, local) for f in _ADDRESS_FLAGS):
            return True
    return False


def head_processes(port: int, processes: Iterable[HeadProcess], local: Collection[str]) -> list[HeadProcess]:
    """Of ``processes``, those that name the head at ``port`` and all their descendants."""
    procs = list(processes)
    children: dict[int, list[HeadProcess]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    found: dict[int, HeadProcess] = {}
    todo = [p for p in procs if names_head(p.argv, port, local)]
    while todo:
        p = todo.pop()
        if p.pid not in found:
            found[p.pid] = p
            todo += children.get(p.pid, [])
    return sorted(found.values(), key=lambda p: p.pid)


def running_processes() -> list[HeadProcess]:
    """Every process of this machine that can be read (others' and vanished ones skipped)."""
    out = []
    for proc in psutil.process_iter(["pid", "ppid", "cmdline"]):
        argv = proc.info.get("cmdline")
        if argv:
            out.append(HeadProcess(proc.info["pid"], proc.info["ppid"] or 0, tuple(argv)))
    return out


def local_addresses() -> set[str]:
    """This machine's addresses (every interface's, the loopback ones and its host name's)."""
    hosts = {"127.0.0.1", "localhost", "::1", socket.gethostname()}
    for addrs in psutil.net_if_addrs().values():
        hosts.update(a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
    return hosts


def stop_processes(procs: Sequence[HeadProcess], timeout_s: float = 10.0) -> int:
    """Kill ``procs`` (SIGKILL, as ``ray stop --force`` does; never this process) and wait up to
    ``timeout_s`` for them to go; returns how many were signalled."""
    killed = []
    for p in procs:
        if p.pid == os.getpid():
            continue
        try:
            proc = psutil.Process(p.pid)
            proc.kill()
            killed.append(proc)
        except psutil.Error:
            continue  # NOTE: gone already (a worker whose raylet went first)
    psutil.wait_procs(killed, timeout=timeout_s)
    return len(killed)


def client_proxy_forks_with_grpc_handlers(port: int) -> bool | None:
    """Whether the Ray client proxy of the head at ``port`` on this machine runs with gRPC's
    fork handlers on (``GRPC_ENABLE_FORK_SUPPORT`` not ``0``: some of its per-client servers then
    die at birth, Ray issue #63202); ``None`` where no such proxy is found or its environment
    cannot be read."""
    local = local_addresses()
    for p in running_processes():
        if "--mode=proxy" in p.argv and names_head(p.argv, port, local):
            try:
                return psutil.Process(p.pid).environ().get("GRPC_ENABLE_FORK_SUPPORT") != "0"
            except psutil.Error:
                return None
    return None


def current_cluster_record(temp_dir: str = "") -> Path:
    """Ray's record of the latest cluster started here (``ray_current_cluster``, which a plain
    ``ray.init()`` joins) in Ray's temp folder ``temp_dir`` ("": Ray's default, ``RAY_TMPDIR`` or
    ``TMPDIR`` else ``/tmp``, then ``ray``)."""
    system = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return Path(temp_dir or os.path.join(system, "ray")) / "ray_current_cluster"


def forget_current_cluster(port: int, temp_dir: str = "") -> None:
    """Remove Ray's record of the latest cluster started here (:func:`current_cluster_record`)
    when it names the head at ``port``, as ``ray stop`` does."""
    record = current_cluster_record(temp_dir)
    try:
        named = record.read_text().strip()
    except OSError:
        return
    if _is_head(named, port, local_addresses()):
        record.unlink(missing_ok=True)
