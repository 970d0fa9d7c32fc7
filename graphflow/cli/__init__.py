"""The ``graphflow`` command. Every command takes ``--json``: one JSON object as the last line.

One module per command group (``check``, ``bench``, ``sweep`` with ``calibrate``, ``serve``,
``submit`` with ``status``, ``workflow``, ``cluster``, ``models``); ``_common`` holds the output
helpers and the error policy they share.
"""

from __future__ import annotations

import inspect

import typer

from graphflow.cli import bench, check, cluster, models, serve, submit, sweep, workflow
from graphflow.cli._common import stopped_by_signal

__all__ = ["app", "main"]

_CTRL_C_EXIT = 130  # NOTE: what Typer exits with on KeyboardInterrupt

app = typer.Typer(
    help="GraphFlow: serve LLM-agent workflows with the KV cache as a first-class object.", no_args_is_help=True
)
for group, name in (
    (models.app, "models"),
    (check.app, "check"),
    (bench.app, "bench"),
    (sweep.sweep_app, "sweep"),
    (cluster.app, "cluster"),
    (workflow.wgraph_app, "wgraph"),
    (workflow.train_app, "train"),
    (workflow.eval_app, "eval"),
):
    app.add_typer(group, name=name)
for command, name in (
    (serve.serve, "serve"),
    (submit.submit, "submit"),
    (submit.status, "status"),
    (serve.shutdown, "shutdown"),
    (serve.demo, "demo"),
    (sweep.calibrate_cmd, "calibrate"),
    (workflow.generate, "generate"),
):
    app.command(name)(command)


def _one_line_summaries(group: typer.Typer) -> None:
    """Give every command of ``group`` (and its subgroups) its docstring's first paragraph on one
    line as the summary its group's ``--help`` lists: Typer's rich help keeps the docstring's line
    breaks there, which cut the listing's sentences mid-line."""
    for info in group.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback is not None else None)
        if info.short_help is None and doc:
            info.short_help = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _one_line_summaries(sub.typer_instance)


_one_line_summaries(app)


def main() -> None:
    """The command line: SIGTERM and SIGHUP stop any command as Ctrl-C does (its clean-up runs, Ray's
    embedded processes included), and the exit status is then 128 + the signal's number, as a
    shell reports a process that signal ended (Typer reports Ctrl-C as 130)."""
    with stopped_by_signal() as stop:
        try:
            app()
        except SystemExit as done:
            if stop.signum is not None and done.code == _CTRL_C_EXIT:
                raise SystemExit(128 + stop.signum) from None
            raise
