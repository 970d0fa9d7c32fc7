"""The CLI's error policy: caller mistakes and what the machine lacks are one line and exit 2;
broken state (RuntimeError) keeps its traceback."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from graphflow.cli._common import ints, names, user_errors
from graphflow.runtime.errors import Unavailable

runner = CliRunner()


def _app(exc: BaseException) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @user_errors
    def fail() -> None:
        raise exc

    return app


def test_a_caller_mistake_and_a_missing_tool_are_one_line_and_exit_2():
    for exc in (ValueError("--load must be at least 1, got 0"), Unavailable("mpirun not found; install the project")):
        result = runner.invoke(_app(exc), [])
        assert result.exit_code == 2
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and str(exc) in lines[0]


def test_a_path_that_cannot_be_used_is_one_line_naming_it():
    result = runner.invoke(_app(FileNotFoundError(2, "No such file or directory", "/no/such/wf.yaml")), [])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "/no/such/wf.yaml: No such file or directory; give a path whose folder exists" in lines[0]
    result = runner.invoke(_app(PermissionError("[Errno 13] Failed to open local file '/x'")), [])
    assert result.exit_code == 2 and "Failed to open local file '/x'" in result.output


def test_broken_state_is_not_turned_into_a_user_error():
    result = runner.invoke(_app(RuntimeError("block refcounts do not match")), [])
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)


def test_list_options():
    assert ints("32, 64", "--tokens") == [32, 64]
    assert names(" ucx, ,mpi ") == ["ucx", "mpi"]
    for bad in ("1k", "0,4", ""):
        try:
            ints(bad, "--tokens")
        except ValueError as exc:
            assert "--tokens" in str(exc)
        else:
            raise AssertionError(f"{bad!r} was accepted")


def test_trace_table_sets_the_prediction_beside_the_first_token_and_keeps_names_whole():
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from graphflow.cli._common import trace_table
    from graphflow.runtime.trace import NodeTrace

    row = NodeTrace(
        "n12",
        "graphflow-replica-1",
        "transfer",
        "graphflow-replica-0",
        0.0561,
        0.4987,
        0.0994,
        5_160_960,
        16,
        4096,
        4112,
        "x",
    )
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(trace_table("per-node decisions", SimpleNamespace(trace=[row])))
    shown = console.export_text()
    assert "…" not in shown and max(len(line) for line in shown.splitlines()) <= 80, shown
    for whole in ("n12", "replica-1", "transfer", "replica-0", "5,160,960"):
        assert whole in shown, whole
    flat = " ".join(shown.replace("│", " ").split())
    # predicted (the state ready), then the measured first token, then the whole node
    assert flat.index("0.056") < flat.index("0.099") < flat.index("0.499"), flat


def test_sigterm_and_sighup_stop_a_foreground_command_as_ctrl_c_does():
    import signal

    from graphflow.cli._common import stopped_by_signal

    before = signal.getsignal(signal.SIGTERM)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(KeyboardInterrupt) as stopped, stopped_by_signal():
            _signalled(signum)
        assert stopped.value.args == (signal.Signals(signum).name,)
    assert signal.getsignal(signal.SIGTERM) == before  # NOTE: the handlers before are back
    with stopped_by_signal() as stop:
        pass
    assert stop.signum is None  # NOTE: a block no signal ended says so


def test_a_command_a_stop_signal_ends_exits_128_plus_its_number(monkeypatch):
    """`graphflow`'s main: SIGTERM / SIGHUP end a command as Ctrl-C does (Typer's 130), and the
    exit status names the signal as a shell would (143 / 129); Ctrl-C itself stays 130."""
    import signal

    import graphflow.cli as cli

    ctrl_c = signal.signal(signal.SIGINT, signal.default_int_handler)  # NOTE: Python's, whatever ran before
    try:
        for signum, code in ((signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)):
            app = typer.Typer()

            @app.command()
            def wait(signum: int = signum) -> None:
                _signalled(signum)

            monkeypatch.setattr(cli, "app", app)
            monkeypatch.setattr("sys.argv", ["graphflow"])
            with pytest.raises(SystemExit) as done:
                cli.main()
            assert done.value.code == code, signal.Signals(signum).name
    finally:
        signal.signal(signal.SIGINT, ctrl_c)


def _signalled(signum: int) -> None:
    """Send ``signum`` to this process's main thread and give its handler up to 5 s to run (it runs
    at once; the wait is bounded so that a handler that does not raise fails the test instead of
    hanging it, as ``signal.pause`` did once another thread had taken the signal)."""
    import signal
    import threading
    import time

    signal.pthread_kill(threading.main_thread().ident or 0, signum)
    for _ in range(500):
        time.sleep(0.01)
