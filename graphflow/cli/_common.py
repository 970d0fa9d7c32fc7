"""What every command module of the CLI shares: the consoles, ``--json`` output, progress
lines, list options, and the one place caller mistakes become a one-line error."""

from __future__ import annotations

import functools
import json
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from graphflow.runtime.errors import Unavailable, error_message
from transport.errors import TransportError

__all__ = [
    "STOP_SIGNALS",
    "Stop",
    "emit",
    "err",
    "folding_table",
    "ints",
    "kv_table",
    "names",
    "out",
    "say",
    "stopped_by_signal",
    "trace_table",
    "user_errors",
]

err = Console(stderr=True)
# NOTE: tables are wide; when output is piped (no terminal width) render them at 140 columns.
out = Console() if sys.stdout.isatty() else Console(width=140)
F = TypeVar("F", bound=Callable[..., Any])


def folding_table(*columns: str, title: str | None = None, whole: tuple[str, ...] = ()) -> Table:
    """A table whose cells fold onto more lines where the terminal is narrow, never cut with
    "…" (a figure stays whole); the ``whole`` columns (names) never wrap."""
    return Table(*(Column(c, no_wrap=c in whole, overflow="fold") for c in columns), title=title)


# NOTE: a RuntimeError means our own state is broken (CONVENTIONS): it keeps its traceback
_USER_ERRORS = (ValueError, TypeError, TransportError, Unavailable, ConnectionError, MemoryError)
# NOTE: a path that is not there, not a folder, or not the caller's to write (an --out in a missing folder)
_PATH_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, FileExistsError)


def user_errors(fn: F) -> F:
    """Turn caller mistakes and what the machine or deployment lacks into one line on stderr
    and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (*_USER_ERRORS, *_PATH_ERRORS) as exc:
            said = error_message(exc)
            if isinstance(exc, OSError) and exc.filename is not None:
                said = f"{exc.filename}: {exc.strerror}; give a path whose folder exists and that you may use"
            err.print(f"[bold red]error:[/] {escape(said)}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@dataclass(slots=True)
class Stop:
    """Which of the stop signals ended a :func:`stopped_by_signal` block (``None``: none did)."""

    signum: int | None = None


@contextmanager
def stopped_by_signal(signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[Stop]:
    """Within the block, each of ``signals`` (SIGTERM from ``kill``, ``timeout``, systemd or a
    container runtime; SIGHUP from a closing terminal) raises ``KeyboardInterrupt`` in the main
    thread, as Ctrl-C does, so a foreground command cleans up the same way for all of them (left
    alone, SIGTERM ended the process at once, or Ray's handler in it printed a stack dump). The
    :class:`Stop` it yields records which signal it was. The handlers before are put back after
    it; one that Python did not set becomes the default."""
    stop = Stop()

    def interrupt(signum: int, _frame: object) -> None:
        stop.signum = signum
        raise KeyboardInterrupt(signal.Signals(signum).name)

    before = {s: signal.signal(s, interrupt) for s in signals}
    try:
        yield stop
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def say(msg: str) -> None:
    """A progress line on stderr (stdout stays for the table or the ``--json`` object)."""
    err.print(f"[dim]… {msg}[/]", highlight=False)


def emit(obj: dict[str, Any]) -> None:
    """The ``--json`` result: one JSON object on one line."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def ints(csv: str, what: str) -> list[int]:
    """Positive integers from a comma-separated option (``what`` names it in the error)."""
    try:
        values = [int(x) for x in csv.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, got {csv!r}") from None
    if not values or min(values) <= 0:
        raise ValueError(f"{what} must be positive integers, got {csv!r}")
    return values


def names(csv: str) -> list[str]:
    """The non-empty, stripped items of a comma-separated option."""
    return [x.strip() for x in csv.split(",") if x.strip()]


def kv_table(title: str, values: dict[str, object]) -> None:
    """Print one ``name | value`` table."""
    table = folding_table("", "value", title=title)
    for k, v in values.items():
        table.add_row(k, f"{v:,.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v))
    out.print(table)


def trace_table(title: str, result: Any) -> Table:
    """A workflow run's per-node decisions (``runtime.trace.RunResult.trace``), in few enough
    columns that an 80-column terminal shows each name on one line. The scheduler's prediction
    is of the node's state being ready (prefill, transfer or rebuild), so it stands beside the
    measured first token, not the whole node (which decodes after it)."""
    table = folding_table(
        "node",
        "replica",
        "decision",
        "from",
        "tokens: context / prefilled / saved",
        "bytes moved",
        "s: predicted / TTFT / node",
        title=title,
        whole=("node", "replica", "decision", "from"),
    )
    for t in result.trace:
        table.add_row(
            t.node,
            t.replica.removeprefix("graphflow-"),
            t.decision,
            t.source.removeprefix("graphflow-"),
            f"{t.context_tokens} / {t.prefill_tokens} / {t.prefill_tokens_saved}",
            f"{t.bytes_moved:,}",
            f"{t.predicted_s:.3f} / {t.ttft_s:.3f} / {t.measured_s:.3f}",
        )
    return table
