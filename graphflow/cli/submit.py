"""Commands a client of a running deployment runs: ``graphflow submit`` (a task, or a file of
tasks through one client) and ``graphflow status``."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from graphflow.cli._common import emit, folding_table, out, say, trace_table, user_errors

if TYPE_CHECKING:
    from graphflow.client import TaskOutcome
    from graphflow.kv.events import ManagerStats
    from graphflow.runtime.stats import ReplicaStats
    from graphflow.workflow.corpus import Workflow

__all__ = [
    "attach",
    "manager_line",
    "result_json",
    "status",
    "status_tables",
    "submit",
    "submitted_tasks",
    "submitted_workflow",
]


def result_json(result: Any) -> dict[str, Any]:
    return {
        "final": result.final,
        "bytes_moved": result.bytes_moved,
        "root_prefill_tokens": result.root_prefill_tokens,
        "prefill_tokens": result.prefill_tokens,
        "prefill_tokens_saved": result.prefill_tokens_saved,
        "wall_s": result.wall_s,
        "trace": [t.__dict__ if hasattr(t, "__dict__") else _slots(t) for t in result.trace],
    }


def _slots(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__slots__}


@user_errors
def submit(
    address: str = typer.Option(..., help="Ray client address of a `graphflow serve` deployment (ray://host:10001)."),
    task: str = typer.Option("", help="The task's text (or --tasks-file)."),
    tasks_file: Path | None = typer.Option(
        None,
        "--tasks-file",
        help="A file of tasks, one per line (blank lines skipped; a line may be a JSON object whose question, "
        "problem, prompt or context is the task, as in the benchmark files), run through one client with --concurrency "
        "workflows in flight; a task the deployment refuses (or that runs out of time) gets its error and the "
        "others go on (the command then exits 1).",
    ),
    concurrency: int = typer.Option(4, help="Workflows in flight at once with --tasks-file."),
    workflow_file: Path | None = typer.Option(
        None,
        "--workflow",
        help="Run every task through this workflow (YAML, one workflow: what `graphflow generate --out` "
        "writes) instead of the one a replica plans for it.",
    ),
    timeout: float = typer.Option(
        0.0,
        help="Seconds each task (its plan and workflow) may run before it is given up (0: no limit); exit 2, "
        "or 1 in a file.",
    ),
    model: str = typer.Option("", help="Model the task is meant for ('' = whatever is served)."),
    decode: int = typer.Option(16, help="Tokens each node generates after its first (decode steps)."),
    no_reuse: bool = typer.Option(False, "--no-reuse", help="Turn every KV reuse and transfer off."),
    recalibrate: bool = typer.Option(
        False, "--recalibrate", help="Re-measure costs instead of using the ones `serve` measured."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Submit a task (or a file of tasks) to a running deployment; prints the output and the
    per-node trace (for a file: one line per task and the tasks per second)."""
    tasks = submitted_tasks(task, tasks_file, concurrency)  # NOTE: before the seconds of imports and attaching
    if timeout < 0:
        raise ValueError(f"--timeout must be 0 (no limit) or more, got {timeout:g}")
    timeout_s = timeout or None
    workflow = submitted_workflow(workflow_file) if workflow_file is not None else None
    from graphflow.client import check_decode_steps, connect

    check_decode_steps(decode)
    from graphflow.workflow.compile import compile_workflow

    say(f"connecting to the deployment at {address}")
    client = connect(address, decode_steps=decode, recalibrate=recalibrate)
    client.served_model(model)
    if workflow is not None:
        compile_workflow(workflow, client.templates)  # NOTE: an operation the deployment has no template for
    say(f"running {_count(len(tasks), 'workflow')} on {len(client.cluster.replicas)} replicas")
    if tasks_file is None:
        result = client.run(
            task,
            workflow,
            reuse=not no_reuse,
            on_node=lambda t: say(f"{t.node}: {t.decision} on {t.replica}"),
            timeout_s=timeout_s,
        )
        if json_out:
            emit(result_json(result))
        else:
            out.print(trace_table("per-node decisions", result))
            out.print(f"output: {result.final!r}")
        return
    start = time.perf_counter()
    finished = itertools.count(1)
    outcomes = client.run_many(
        tasks,
        concurrency,
        workflow=workflow,
        timeout_s=timeout_s,
        reuse=not no_reuse,
        on_task=lambda o: say(
            f"task {o.index + 1} ({next(finished)} of {len(tasks)} done): "
            + (f"{o.seconds:.2f} s" if o.result is not None else o.why)
        ),
    )
    wall = time.perf_counter() - start
    ran = sum(o.result is not None for o in outcomes)
    if json_out:
        runs = [
            {
                "task": o.task,
                "seconds": o.seconds,
                **(result_json(o.result) if o.result else {"error": o.error, "timed_out": o.timed_out}),
            }
            for o in outcomes
        ]
        emit({"runs": runs, "wall_s": wall, "tasks_per_s": ran / wall, "concurrency": concurrency})
        _exit_if_any_failed(outcomes)
        return
    table = folding_table("#", "task", "nodes", "s", "first token s", "bytes moved", "output", title="tasks")
    for o in outcomes:
        r = o.result
        if r is None:
            table.add_row(str(o.index + 1), _preview(o.task), "", f"{o.seconds:.2f}", "", "", o.why)
            continue
        first = min((t.ttft_s for t in r.nodes), default=0.0)
        table.add_row(
            str(o.index + 1),
            _preview(o.task),
            str(len(r.nodes)),
            f"{o.seconds:.2f}",
            f"{first:.3f}",
            f"{r.bytes_moved:,}",
            _preview(repr(r.final)),
        )
    out.print(table)
    out.print(
        f"{ran} of {_count(len(tasks), 'task')} ran in {wall:.1f} s: {ran / wall:.2f} tasks/s, {concurrency} in flight"
    )
    _exit_if_any_failed(outcomes)


def _exit_if_any_failed(outcomes: Sequence[TaskOutcome]) -> None:
    """Exit 1 when any task of a file was refused or ran out of time (each said why), so a script
    sees it."""
    late = sum(o.timed_out for o in outcomes)
    refused = sum(o.result is None for o in outcomes) - late
    said = [
        f"{n} of {_count(len(outcomes), 'task')} {what}"
        for n, what in ((refused, "refused"), (late, "out of time"))
        if n
    ]
    if said:
        say("; ".join(said))
        raise typer.Exit(1)


def _preview(text: str, chars: int = 48) -> str:
    """The start of ``text`` for a table row (``--json`` has it whole)."""
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def submitted_workflow(path: Path) -> Workflow:
    """The one workflow of a ``--workflow`` file, checked before anything connects."""
    from graphflow.workflow.corpus import load_yaml_workflows

    try:
        found = load_yaml_workflows(path)
    except OSError as exc:
        raise ValueError(f"cannot read --workflow {path}: {exc.strerror}") from None
    if len(found) != 1:
        raise ValueError(f"--workflow {path} holds {len(found)} workflows; give a file of exactly one")
    return found[0]


def submitted_tasks(task: str, tasks_file: Path | None, concurrency: int) -> list[str]:
    """What ``submit`` was asked to run, checked before anything connects."""
    from graphflow.workflow.tasks import require_task

    if concurrency < 1:  # NOTE: with --task too: an option given is checked, even where it changes nothing
        raise ValueError(f"--concurrency must be 1 or more, got {concurrency}")
    if tasks_file is None:
        if not task:
            raise ValueError("nothing to run; give --task TEXT or --tasks-file FILE")
        require_task(task)
        return [task]
    if task:
        raise ValueError("give --task or --tasks-file, not both")
    try:
        lines = tasks_file.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read --tasks-file {tasks_file}: {exc.strerror}") from None
    tasks = [_task_of_line(line.strip(), n, tasks_file) for n, line in enumerate(lines, 1) if line.strip()]
    if not tasks:
        raise ValueError(f"--tasks-file {tasks_file} has no tasks; write one task per line")
    return tasks


def _task_of_line(line: str, n: int, path: Path) -> str:
    """A tasks file's line: the task's text, or a JSON object whose question / problem / prompt /
    context field is (a line of the benchmark files in ``shared/data/tasks``)."""
    import json

    from graphflow.workflow.tasks import TEXT_FIELDS, task_text

    if not line.startswith("{"):
        return line
    try:
        raw = json.loads(line)
    except json.JSONDecodeError:
        return line  # NOTE: a task's text that happens to start with a brace
    text = task_text(raw) if isinstance(raw, dict) else None
    if text is None:
        raise ValueError(
            f"line {n} of --tasks-file {path} is a JSON object with no task text; give it one of the fields "
            f"{', '.join(TEXT_FIELDS)}, or write the task's text on the line"
        )
    return text


def attach(address: str) -> Any:
    """The deployment at ``address`` (``RayCluster``), saying so first: through the Ray client
    attaching takes seconds."""
    from graphflow.runtime.actors import RayCluster
    from graphflow.runtime.cluster import connect

    say(f"connecting to the deployment at {address}")
    return RayCluster.attach(connect(address))


def status_tables(stats: Sequence[ReplicaStats]) -> list[Table]:
    """``graphflow status``'s tables: replicas, their KV, and their routes where any replica has
    sent. Two tables where one would not fit, replica names never wrapped and no cell cut with
    "…", so an 80-column terminal shows every name and figure whole (the transport is on the
    ``serving`` line above them)."""
    names = ("replica", "from", "to")
    replicas = folding_table("replica", "model", "host", "device × threads", title="replicas", whole=names)
    kv = folding_table(
        "replica",
        "blocks",
        "states",
        "KV MiB used (peak) of capacity",
        "pool MiB",
        "prefix hits",
        title="KV",
        whole=names,
    )
    for s in stats:
        # NOTE: threads are torch's: the node's cores shared by its replicas
        replicas.add_row(s.replica, s.model, s.host, f"{s.device} ×{s.threads}")
        kv.add_row(
            s.replica,
            str(s.blocks),
            str(s.states),
            f"{s.used_bytes / 2**20:.1f} ({s.peak_bytes / 2**20:.1f}) of {s.capacity_bytes / 2**20:.0f}",
            f"{s.pool_bytes >> 20} of {s.prefaulted_bytes >> 20}",
            f"{s.prefix.hits} ({s.prefix.hit_rate:.0%})",
        )
    routes = folding_table(
        "from", "to", "transports", "path", title="routes (peers each replica has sent to)", whole=names
    )
    running = {s.replica for s in stats}
    for s in stats:
        for r in s.routes:
            path = "shared memory" if r.shared_memory else "network"
            # NOTE: a peer no running replica has the address of (one that died, or a client's probe) is
            # its transport address, hundreds of hex digits for UCX: shown by its start (--json has it whole)
            peer = r.peer if r.peer in running else f"no replica now (address starts {r.peer[:12]})"
            routes.add_row(s.replica, peer, ", ".join(r.transports), path)
    return [replicas, kv, *([routes] if routes.rows else [])]


def manager_line(held: ManagerStats, stats: Sequence[ReplicaStats]) -> str:
    """``graphflow status``'s line about the KV manager (abandoned: runs it ended because their
    client was gone; ended: runs whose records it still keeps a while), beside the blocks the
    replicas ``stats`` hold: once no run is going and no eviction waits, the two counts agree."""
    snap = f"last snapshot {held.snapshot_s:.3f} s" if held.snapshot_s else "no snapshot yet"
    waiting = sum(s.evictions_waiting for s in stats)
    held_here = f"the replicas hold {sum(s.blocks for s in stats)}" + (
        f", {waiting} evictions not yet reported" if waiting else ""
    )
    return (
        f"manager: {held.records} state records, {held.catalog_rows} catalog rows ({held.live_copies} live; "
        f"{held_here}); runs {held.running_runs} running, {held.ended_runs} ended, {held.abandoned_runs} "
        f"abandoned; {snap}"
    )


def replicas_missing_line(running: int, started: int) -> str:
    """``graphflow status``'s line when fewer replicas run than ``serve`` started."""
    return (
        f"{running} of the {started} replicas serve started {'is' if running == 1 else 'are'} running (a replica "
        "that died, or whose node did, is not restarted by itself); `graphflow serve` with the same settings "
        "starts the missing ones afresh"
    )


@user_errors
def status(
    address: str = typer.Option("auto", help="Ray address of the deployment."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Replicas, KV memory and blocks of a running deployment, and its KV manager's records and runs."""
    cluster = attach(address)
    stats = cluster.stats()
    nodes = cluster.nodes()
    served = cluster.deployment()  # what `serve` started (None: a board without it)
    held: ManagerStats = cluster.manager("summary")
    if json_out:
        emit(
            {
                "deployment": asdict(served) if served is not None else None,
                "replicas": [s.to_json() for s in stats],
                "manager": asdict(held),
                "lost": cluster.lost,
                "nodes": [asdict(n) for n in nodes],
            }
        )
        return
    if served is not None:
        out.print(f"serving {served.describe()}")
        if len(stats) < served.replicas:
            out.print(replicas_missing_line(len(stats), served.replicas))
    else:
        out.print(f"serving over {', '.join(sorted({s.transport for s in stats})) or 'no replica'}")
    for table in status_tables(stats):
        out.print(table)
    out.print(manager_line(held, stats))
    gone = [n.host or n.node[:12] for n in nodes if not n.alive]
    if cluster.lost or gone:
        out.print(f"lost replicas: {', '.join(cluster.lost) or 'none'}; dead nodes: {', '.join(gone) or 'none'}")
