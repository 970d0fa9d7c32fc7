"""Start an embedded local Ray, or connect to a cluster, with token auth handled.

Ray 2.60 starts local clusters with token authentication on; a Ray *client* connection
(``ray://``) fails unless ``RAY_AUTH_MODE=token`` is set for both head and client. We set it
for everything we start and explain it when a connection is refused.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from graphflow.runtime.errors import Unavailable

__all__ = [
    "HEAD_ENV",
    "answers",
    "auto_address",
    "connect",
    "ensure_token",
    "forking_proxy",
    "head_record",
    "ray_exe",
    "running_head",
    "shutdown",
    "start_head",
    "start_local",
    "started_here",
    "stop_head",
    "wait_for_nodes",
]


# NOTE: what a head's `ray start` runs with. Ray's client proxy (the `ray://` port) forks a server per
# client from a process whose gRPC threads are busy; with gRPC's fork handlers on (its default), that
# child sometimes died of SIGSEGV before it started (Ray issue #63202, open at Ray 2.60; 3 fresh heads
# of 19 here), and that client's `ray.init` failed after ~40 s (30 s of reconnect grace, 10 s of
# log-stream retries). With the handlers off the child only execs: 0 of 40 failed (README.md).
HEAD_ENV = {"RAY_AUTH_MODE": "token", "GRPC_ENABLE_FORK_SUPPORT": "0"}


def _ray() -> Any:
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray

    return ray


def _init(ray: Any, **kwargs: Any) -> None:
    """``ray.init(**kwargs)``, after which SIGTERM is Python's to handle again.

    A driver's ``ray.init`` sets a Python SIGTERM handler (``sys.exit``), then its C++ core worker
    puts a failure-signal handler over it at the OS level: a SIGTERM then printed a stack dump and
    ended the process by SIGABRT, with no clean-up (what ``timeout``, ``kill`` or a service manager
    did to an embedded command). Here, called from the main thread, the handler Python code set
    before ``ray.init`` (the CLI's: stop as Ctrl-C does) is put back, or, where none was, Ray's own
    Python one, so a SIGTERM ends the process through Python and its ``atexit`` shutdown of Ray.

    A SIGTERM that lands while ``ray.init`` runs reaches Ray's Python handler, ``sys.exit(15)``;
    where Python code had set a handler before, that ``SystemExit`` is handed to it instead, so
    the CLI stops as it does for a SIGTERM at any other time (exit 143, not 15)."""
    on_main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if on_main else None
    stopped: SystemExit | None = None
    try:
        ray.init(**kwargs)
    except SystemExit as exc:
        if not (callable(before) and exc.code == signal.SIGTERM):
            raise
        stopped = exc
    finally:
        if on_main:
            handler = before if callable(before) else signal.getsignal(signal.SIGTERM)
            if callable(handler):
                signal.signal(signal.SIGTERM, handler)
    if stopped is not None and callable(before):
        before(signal.SIGTERM, None)  # NOTE: outside the except block: its exception is the stop's own
        raise stopped  # NOTE: a handler that returned cannot resume an init Ray left half done


def start_local(num_cpus: int | None = None, namespace: str = "graphflow") -> Any:
    """Start (or reuse) an embedded single-machine Ray; returns the ``ray`` module."""
    ray = _ray()
    if not ray.is_initialized():
        _init(
            ray,
            num_cpus=num_cpus,
            namespace=namespace,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    return ray


# NOTE: what Ray prints into every client's stderr that says nothing to a user: the client builder's
# note that it forwards ray.init's arguments, the client server's own init, run off its main thread,
# saying it set no SIGTERM handler (streamed back through the client's log channel), and a driver's two
# lines on connecting (the command has said where it connects)
_CLIENT_NOISE = (
    "Passing the following kwargs to ray.init() on the server",
    "SIGTERM handler is not set",
    "Connecting to existing Ray cluster at address",
)
_CLIENT_NOISE_WHOLE = ("Connected to Ray cluster.",)  # NOTE: not with a dashboard's address after it
_NOISY_LOGGERS = ("ray.client_builder", "ray.util.client.logsclient", "ray._private.worker")


def _quiet(record: logging.LogRecord) -> bool:
    said = record.getMessage()
    return said not in _CLIENT_NOISE_WHOLE and not any(noise in said for noise in _CLIENT_NOISE)


def connect(address: str, namespace: str = "graphflow") -> Any:
    """Connect to an existing cluster (``auto``, ``host:port`` or ``ray://host:10001``)."""
    ray = _ray()
    if ray.is_initialized():
        return ray
    _check_reachable(address)
    for name in _NOISY_LOGGERS:
        if _quiet not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_quiet)
    # NOTE: Ray's client proxy sometimes fails to start the per-client server it needs
    # ("Initialization failure from server"; a head started without HEAD_ENV, Ray issue #63202);
    # that is transient, so ray:// connects are tried three times
    attempts = 3 if address.startswith("ray://") else 1
    for attempt in range(1, attempts + 1):
        try:
            _init(ray, address=address, namespace=namespace, log_to_driver=False)
            return ray
        except ConnectionError as exc:
            ray.shutdown()
            lost_server = "Initialization failure from server" in str(exc)
            if address == "auto" and "Could not find any running Ray instance" in str(exc):
                raise ConnectionError(
                    "no Ray head runs on this machine; start a deployment with `graphflow serve`, or pass "
                    "--address for one elsewhere"
                ) from None
            if lost_server and attempt < attempts:
                time.sleep(2.0 * attempt)
                continue
            hint = (
                f"the head's Ray client proxy lost the server it starts for each client {attempts} times; if the head "
                "runs without GRPC_ENABLE_FORK_SUPPORT=0 (Ray issue #63202), restart it with that variable set"
                if lost_server
                else "Ray 2.60 clusters use token auth: set RAY_AUTH_MODE=token for both the head (ray start) and "
                "this client, with the head's token (RAY_AUTH_TOKEN or ~/.ray/auth_token)"
            )
            if not lost_server and address != "auto" and not address.startswith("ray://"):
                # NOTE: a Ray client port (serve prints ray://host:10001) given without its scheme is
                # asked for a GCS, which it is not; Ray's error then reads as any failed connect
                hint = (
                    f"if {address} is a Ray client port (`serve` prints ray://HOST:10001), pass ray://{address}. {hint}"
                )
            raise ConnectionError(
                f"could not connect to Ray at {address} ({str(exc).splitlines()[0]}). {hint}"
            ) from None
    raise AssertionError("unreachable")


def wait_for_nodes(ray: Any, n: int, timeout_s: float = 300.0, say: Callable[[str], None] | None = None) -> int:
    """Wait until ``n`` Ray nodes are alive (workers a batch script started still joining);
    returns how many are. ``Unavailable`` when fewer joined within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    reported = -1
    while True:
        alive = sum(1 for node in ray.nodes() if node.get("Alive"))
        if alive >= n:
            return alive
        if time.monotonic() > deadline:
            raise Unavailable(
                f"only {alive} of {n} Ray nodes joined within {timeout_s:.0f} s; check the workers' "
                "`ray start --address` output, or lower --min-nodes"
            )
        if say is not None and alive != reported:
            say(f"{alive} of {n} Ray nodes alive; waiting for the rest")
            reported = alive
        time.sleep(1.0)


def ray_exe() -> str:
    """The ``ray`` command of this Python's environment (else the one on ``PATH``)."""
    import shutil
    import sys
    from pathlib import Path

    local = Path(sys.executable).parent / "ray"
    return str(local) if local.exists() else shutil.which("ray") or "ray"


def ensure_token() -> None:
    """A Ray auth token for a head started here: ``RAY_AUTH_TOKEN`` if set, else
    ``~/.ray/auth_token``, made now if missing (``ray start`` refuses to make one, so on a fresh
    machine a head would not start)."""
    import subprocess

    if os.environ.get("RAY_AUTH_TOKEN"):
        return
    proc = subprocess.run([ray_exe(), "get-auth-token", "--generate"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise Unavailable(f"could not make a Ray auth token: {last_line(proc.stderr or proc.stdout)}")


def last_line(output: str, limit: int = 600) -> str:
    """The last non-empty line of a command's output (where Ray puts its error), whole unless it
    is longer than ``limit`` characters."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    line = lines[-1] if lines else "(no output)"
    return line if len(line) <= limit else line[: limit - 1] + "…"


def start_head(port: int = 6379, client_port: int = 10001) -> str:
    """Start a local Ray head (``ray start --head``) with token auth, making this machine's token
    first if it has none; returns its address. The head runs in a session of its own: a signal to
    the caller's process group (Ctrl-C in its terminal, ``timeout``, the terminal closing) does
    not reach its processes (a GCS server sent SIGTERM there hung in Ray's own signal handler and
    stayed, answering nobody); whoever started it stops it (:func:`stop_head`)."""
    import subprocess

    os.environ["RAY_AUTH_MODE"] = "token"
    ensure_token()
    proc = subprocess.run(
        [
            ray_exe(),
            "start",
            "--head",
            f"--port={port}",
            f"--ray-client-server-port={client_port}",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **HEAD_ENV},
        start_new_session=True,
    )
    if proc.returncode != 0:
        raise Unavailable(f"could not start a Ray head: {last_line(proc.stderr)}")
    return f"127.0.0.1:{port}"


def head_record(address: str) -> dict[str, str]:
    """What a deployment keeps about the Ray head its ``serve`` started at ``address``: that
    address and this machine's host name, so that ``shutdown`` stops only that head, and only
    from the machine it runs on."""
    import socket

    return {"address": address, "host": socket.gethostname()}


def started_here(record: object) -> bool:
    """Whether ``record`` (a :func:`head_record`, or ``None`` for a head that ``serve`` was
    given) names a head started on this machine."""
    import socket

    return isinstance(record, dict) and record.get("host") == socket.gethostname()


def stop_head(address: str) -> int:
    """Stop the Ray head at ``address`` (``host:port``, started on this machine) — its processes,
    its workers and agents — and no other Ray here; returns how many processes were stopped."""
    from graphflow.runtime import head_processes as hp

    port = int(address.rpartition(":")[2])
    stopped = hp.stop_processes(hp.head_processes(port, hp.running_processes(), hp.local_addresses()))
    hp.forget_current_cluster(port)
    return stopped


def forking_proxy(address: str) -> str:
    """One sentence where the Ray head at ``address`` runs on this machine with its client proxy
    forking under gRPC's fork handlers (started without :data:`HEAD_ENV`), else ``""``."""
    from graphflow.runtime import head_processes as hp

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if (
        not port.isdigit()
        or host not in hp.local_addresses()
        or not hp.client_proxy_forks_with_grpc_handlers(int(port))
    ):
        return ""
    return (
        f"the Ray head at {address} runs without GRPC_ENABLE_FORK_SUPPORT=0, so some Ray clients will wait ~40 s "
        "before connecting (Ray issue #63202); start it with that variable set"
    )


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast (one clear sentence) when nothing listens at ``host:port``, or where ``auto``
    leads (:func:`auto_address`); Ray itself retries an unreachable head for minutes."""
    if address == "auto":
        found, where = auto_address()
        if found and ":" in found and not answers(found, timeout_s):
            raise ConnectionError(
                f"{where} names the Ray head at {found}, where nothing answers (that head is gone); start a "
                "deployment with `graphflow serve`, or pass --address for one elsewhere"
            )
        return
    if ":" not in address:
        return
    if not answers(address, timeout_s):
        raise ConnectionError(
            f"nothing answers at {address}; start a deployment with `graphflow serve` or check the address"
        )


def auto_address() -> tuple[str, str]:
    """Where ``ray.init(address="auto")`` connects, as Ray resolves it, and what said so:
    ``RAY_ADDRESS`` when set, else Ray's record of the last head started on this machine
    (``head_processes.current_cluster_record``); ``("", "")`` when neither names one (Ray then
    looks for a running head itself and says when there is none). A head that died without
    ``ray stop`` leaves that record behind, and Ray retries it for minutes."""
    from graphflow.runtime.head_processes import current_cluster_record

    env = os.environ.get("RAY_ADDRESS", "")
    if env and env != "auto":
        return env, "RAY_ADDRESS"
    record = current_cluster_record()
    try:
        named = record.read_text().strip()
    except OSError:
        return "", ""
    return (named, f"Ray's record of the last head started here ({record})") if named else ("", "")


def answers(address: str, timeout_s: float = 5.0) -> bool:
    """Whether something listens at ``host:port`` (``ray://`` stripped; no host: this machine)."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def running_head(port: int = 6379) -> str:
    """``127.0.0.1:port`` where something listens on this machine's ``port`` (a Ray head an
    earlier ``graphflow serve`` or ``ray start --head`` started, as a rule: ``serve`` joins it to
    make sure), else ``""``."""
    address = f"127.0.0.1:{port}"
    return address if answers(address, 1.0) else ""


def shutdown() -> None:
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()
