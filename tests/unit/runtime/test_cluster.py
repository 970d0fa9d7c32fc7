"""``wait_for_nodes``: a batch script's serve waits for its workers to join (no Ray here: a
cluster whose ``nodes()`` answers grow as workers join); ``last_line``: what of a failed
``ray`` command's output an error quotes; ``started_here``: which head ``shutdown`` may stop;
``start_head``: what the head's ``ray start`` runs with (its command recorded, not run);
``connect``: which refusals it tries again and what it says (a ``ray`` whose ``init`` fails)."""

from __future__ import annotations

import subprocess

import pytest

from graphflow.runtime import cluster
from graphflow.runtime.cluster import head_record, last_line, start_head, started_here, wait_for_nodes
from graphflow.runtime.errors import Unavailable


class Joining:
    """``ray.nodes()`` of a cluster whose workers join one per call, up to ``total``."""

    def __init__(self, total: int, dead: int = 0) -> None:
        self.total, self.dead, self.calls = total, dead, 0

    def nodes(self) -> list[dict[str, object]]:
        self.calls += 1
        alive = [{"Alive": True}] * min(self.calls, self.total)
        return alive + [{"Alive": False}] * self.dead


def test_it_returns_once_enough_nodes_are_alive(monkeypatch):
    monkeypatch.setattr("graphflow.runtime.cluster.time.sleep", lambda _s: None)
    said: list[str] = []
    ray = Joining(3, dead=2)  # dead nodes never count
    assert wait_for_nodes(ray, 3, say=said.append) == 3
    assert ray.calls == 3 and said == [
        "1 of 3 Ray nodes alive; waiting for the rest",
        "2 of 3 Ray nodes alive; waiting for the rest",
    ]


def test_too_few_nodes_is_one_clear_error(monkeypatch):
    monkeypatch.setattr("graphflow.runtime.cluster.time.sleep", lambda _s: None)
    joined = Joining(2)
    joined.calls = 1  # both workers are in already; nothing more comes
    with pytest.raises(Unavailable, match=r"only 2 of 4 Ray nodes joined within 0 s; .*lower --min-nodes"):
        wait_for_nodes(joined, 4, timeout_s=0.0)


def test_last_line_quotes_rays_error_line_whole_and_bounds_a_long_one():
    error = "AuthenticationError: no token was found. Run `ray get-auth-token --generate`"
    assert last_line(f"Traceback (most recent call last):\n  File x, line 1\n{error}\n\n") == error
    assert last_line("") == "(no output)"
    long = last_line("x" * 1000, limit=50)
    assert len(long) == 50 and long.endswith("…")


def test_shutdown_stops_only_a_head_serve_started_on_this_machine():
    assert started_here(head_record("127.0.0.1:6379"))
    assert not started_here(None)  # serve was given the head (--address): never stopped
    assert not started_here({**head_record("127.0.0.1:6379"), "host": "another-machine"})


def test_a_started_head_runs_without_grpc_fork_handlers(monkeypatch):
    """Ray's client proxy forks a server per client; with gRPC's fork handlers on, some of those
    children died at birth (Ray issue #63202), so the head's processes run with them off."""
    ran: list[tuple[list[str], dict[str, str]]] = []

    def run(cmd, **kw):
        assert kw["start_new_session"]  # NOTE: signals to the caller's process group do not reach the head
        ran.append((cmd, kw["env"]))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setenv("RAY_AUTH_TOKEN", "t")  # no token to make
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # start_head sets it; restored after the test
    monkeypatch.setattr(subprocess, "run", run)
    assert start_head(port=6390, client_port=10009) == "127.0.0.1:6390"
    ((cmd, env),) = ran
    assert cmd[1:3] == ["start", "--head"] and "--ray-client-server-port=10009" in cmd
    assert env["GRPC_ENABLE_FORK_SUPPORT"] == "0" and env["RAY_AUTH_MODE"] == "token"


class Refusing:
    """A ``ray`` module whose every ``init`` fails with ``error``."""

    def __init__(self, error: str) -> None:
        self.error, self.inits = error, 0

    def is_initialized(self) -> bool:
        return False

    def init(self, **_kw) -> None:
        self.inits += 1
        raise ConnectionError(self.error)

    def shutdown(self) -> None:
        pass


def _refused(monkeypatch, error: str, address: str = "ray://127.0.0.1:1") -> tuple[Refusing, str]:
    ray = Refusing(error)
    monkeypatch.setattr(cluster, "_ray", lambda: ray)
    monkeypatch.setattr(cluster.time, "sleep", lambda _s: None)
    with pytest.raises(ConnectionError) as refused:
        cluster.connect(address)  # NOTE: nothing listens at port 1; the reachability check is skipped
    return ray, str(refused.value)


def test_a_lost_client_server_is_tried_three_times_and_named(monkeypatch):
    monkeypatch.setattr(cluster, "_check_reachable", lambda _a: None)
    ray, said = _refused(monkeypatch, "Initialization failure from server:\nTraceback …")
    assert ray.inits == 3 and "GRPC_ENABLE_FORK_SUPPORT=0" in said and "token" not in said


def test_a_refused_token_is_tried_once_and_explained(monkeypatch):
    monkeypatch.setattr(cluster, "_check_reachable", lambda _a: None)
    ray, said = _refused(monkeypatch, "Authentication failed")
    assert ray.inits == 1 and "RAY_AUTH_MODE=token" in said and "GRPC" not in said


def test_no_head_on_this_machine_says_to_serve_without_rays_wording(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # NOTE: no record of a head started here
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray, said = _refused(monkeypatch, "Could not find any running Ray instance. Please specify …", address="auto")
    assert ray.inits == 1 and "graphflow serve" in said and "--address" in said and "token" not in said


def test_a_client_connect_drops_rays_two_notes_to_nobody_and_keeps_the_rest(monkeypatch):
    import logging

    monkeypatch.setattr(cluster, "_check_reachable", lambda _a: None)
    _refused(monkeypatch, "Authentication failed")  # NOTE: the filters go on before Ray is asked
    streamed, builder = logging.getLogger("ray.util.client.logsclient"), logging.getLogger("ray.client_builder")
    kept = []
    for logger in (streamed, builder):
        monkeypatch.setattr(logger, "callHandlers", lambda record: kept.append(record.getMessage()))
        monkeypatch.setattr(logger, "level", logging.DEBUG)
    streamed.warning("SIGTERM handler is not set because current thread is not the main thread.")
    streamed.error("worker died")
    builder.info("Passing the following kwargs to ray.init() on the server: x")
    builder.info("Connecting")
    builder.info("Connected to Ray cluster.")
    builder.info("Connected to Ray cluster. View the dashboard at http://h:8265")
    assert kept == ["worker died", "Connecting", "Connected to Ray cluster. View the dashboard at http://h:8265"]
    assert builder.filters == streamed.filters == logging.getLogger("ray._private.worker").filters == [cluster._quiet]


def test_auto_fails_at_once_where_rays_record_names_a_head_that_is_gone(monkeypatch, tmp_path):
    """A head that died without ``ray stop`` leaves Ray's record behind; ``auto`` would retry it
    for minutes. The connect says so in one sentence and never asks Ray."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:1\n")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster.auto_address() == (
        "127.0.0.1:1",
        f"Ray's record of the last head started here ({tmp_path}/ray/ray_current_cluster)",
    )
    ray = Refusing("never asked")
    monkeypatch.setattr(cluster, "_ray", lambda: ray)
    with pytest.raises(ConnectionError, match="names the Ray head at 127.0.0.1:1, where nothing answers") as refused:
        cluster.connect("auto")
    assert ray.inits == 0 and "graphflow serve" in str(refused.value)
    monkeypatch.setenv("RAY_ADDRESS", "ray://127.0.0.1:2")  # NOTE: Ray's own order: the variable first
    assert cluster.auto_address() == ("ray://127.0.0.1:2", "RAY_ADDRESS")
    with pytest.raises(ConnectionError, match="RAY_ADDRESS names the Ray head at ray://127.0.0.1:2"):
        cluster.connect("auto")


def test_a_client_port_given_without_its_scheme_is_pointed_at_ray_scheme(monkeypatch):
    monkeypatch.setattr(cluster, "_check_reachable", lambda _a: None)
    _, said = _refused(monkeypatch, "Failed to connect to Ray cluster at 10.0.0.1:10001", address="10.0.0.1:10001")
    assert "pass ray://10.0.0.1:10001" in said and "RAY_AUTH_MODE=token" in said
    _, said = _refused(monkeypatch, "Authentication failed")  # NOTE: a ray:// address: no such hint
    assert "pass ray://" not in said


class SigtermTakingRay:
    """A ``ray`` whose ``init`` does to SIGTERM what a driver's does: sets Ray's Python handler,
    then puts a handler of its own C++ core over it at the OS level (here: ignore it)."""

    def __init__(self, told: list[str]) -> None:
        self.told = told

    def is_initialized(self) -> bool:
        return False

    def init(self, **_kwargs: object) -> None:
        import ctypes
        import signal

        signal.signal(signal.SIGTERM, lambda *_: self.told.append("ray"))
        libc = ctypes.CDLL(None)
        libc.signal.argtypes, libc.signal.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
        libc.signal(signal.SIGTERM, 1)  # NOTE: SIG_IGN, behind Python's back


def test_after_ray_starts_sigterm_is_handled_in_python_again(monkeypatch):
    """``start_local``: a SIGTERM reaches the handler Python code set before Ray started (the
    CLI's), or Ray's own Python one where there was none, not the handler Ray's core put there."""
    import os
    import signal
    import time

    told: list[str] = []
    monkeypatch.setattr(cluster, "_ray", lambda: SigtermTakingRay(told))
    before = signal.getsignal(signal.SIGTERM)

    def terminated() -> list[str]:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # NOTE: Python runs the handler between bytecodes, at once in practice
            if told:
                break
            time.sleep(0.01)
        return told

    try:
        signal.signal(signal.SIGTERM, lambda *_: told.append("cli"))
        cluster.start_local()
        assert terminated() == ["cli"]
        told.clear()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        cluster.start_local()
        assert terminated() == ["ray"]
    finally:
        signal.signal(signal.SIGTERM, before)


class SigtermDuringInitRay:
    """A ``ray`` whose ``init`` sets Ray's Python SIGTERM handler (``sys.exit(signum)``) and is
    sent SIGTERM before it returns."""

    def is_initialized(self) -> bool:
        return False

    def init(self, **_kwargs: object) -> None:
        import signal
        import sys
        import threading
        import time

        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(signum))
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        time.sleep(5)  # NOTE: the handler runs at the next bytecode; never sleeps this long
        raise AssertionError("the SIGTERM did not interrupt init")


def test_a_sigterm_while_ray_starts_reaches_the_handler_set_before(monkeypatch):
    """A SIGTERM during ``ray.init`` stops a CLI command as one at any other time does (its
    handler runs: exit 143 through the command's clean-up), not with Ray's ``sys.exit(15)``;
    with no handler set before, Ray's ``SystemExit(15)`` goes on as it was."""
    import signal

    monkeypatch.setattr(cluster, "_ray", lambda: SigtermDuringInitRay())
    before = signal.getsignal(signal.SIGTERM)
    told: list[int] = []

    class Stopped(Exception):
        pass

    def cli_handler(signum: int, _frame: object) -> None:
        told.append(signum)
        raise Stopped

    try:
        signal.signal(signal.SIGTERM, cli_handler)
        with pytest.raises(Stopped):
            cluster.start_local()
        assert told == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is cli_handler
        signal.signal(signal.SIGTERM, lambda signum, _frame: told.append(signum))  # NOTE: one that returns
        with pytest.raises(SystemExit):
            cluster.start_local()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with pytest.raises(SystemExit) as ended:
            cluster.start_local()
        assert ended.value.code == signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, before)
