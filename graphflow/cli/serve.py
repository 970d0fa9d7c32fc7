"""Serving commands: ``graphflow serve``, ``shutdown`` and ``demo`` (the main job, embedded);
what a client of the deployment runs (``submit``, ``status``) is in :mod:`graphflow.cli.submit`."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer

from graphflow.cli._common import emit, folding_table, out, say, stopped_by_signal, trace_table, user_errors
from graphflow.cli.submit import attach
from graphflow.runtime.batch_limits import MAX_BATCH_TOKENS
from graphflow.workflow.shapes import fan_out_workflow

__all__ = ["client_address", "demo", "serve", "shutdown"]

DEMO_TASK_FILES = ("gsm8k_validate.jsonl", "mbpp_validate.jsonl")


def client_address(head: str) -> str:
    """The ``ray://`` address clients use for a deployment whose head is ``head`` (its Ray
    client server on port 10001, as ``graphflow serve`` and ``deploy/`` start it)."""
    if head.startswith("ray://"):
        return head
    host = head.rsplit(":", 1)[0] if ":" in head else head
    return f"ray://{host}:10001"


@user_errors
def serve(
    model: str = typer.Option("tiny-llama", help="Model every replica serves."),
    replicas: int = typer.Option(2, help="Replica actors to start."),
    address: str = typer.Option(
        "", help="Ray cluster to deploy on ('' = this machine's Ray head on port 6379, started if none runs)."
    ),
    capacity_mib: int = typer.Option(1024, help="KV block store budget per replica (MiB)."),
    kv_mode: str = typer.Option(
        "exact",
        help="Template KV: exact (never approximate), differential (base + residual for hot paths) "
        "or stateless (base only).",
    ),
    transport: str = typer.Option(
        "ucx", help="How replicas move KV: ucx (shared memory on one host, tcp/IB across) or ray (object store)."
    ),
    device: str = typer.Option("cpu", help="Where each replica's engine and KV live: cpu or cuda."),
    recompute_head: int = typer.Option(
        12, help="Differential mode: template tokens recomputed after the prefix instead of rebuilt."
    ),
    recompute_fraction: float = typer.Option(
        0.0, help="Differential mode: recompute at least this fraction of each template (e.g. 0.15)."
    ),
    templates: str = typer.Option(
        "short", help="Operation templates clients compile workflows with: short or detailed (250-800 tokens)."
    ),
    gpus_per_replica: float | None = typer.Option(
        None, help="GPUs Ray reserves for each replica (default: 1 with --device cuda, 0 on cpu)."
    ),
    threads: int = typer.Option(
        0, help="Torch threads per replica (0 = each node's CPUs shared by the deployment's replicas on it)."
    ),
    prefault_mib: int = typer.Option(
        -1,
        help="Memory each replica faults in at start for KV it receives (-1 = the whole capacity; "
        "0 = on demand); the pool hands back what the KV the replica computes takes of its store.",
    ),
    spread: bool = typer.Option(
        False, "--spread", help="Place replicas round-robin over the cluster's nodes (the manager on the head)."
    ),
    no_batching: bool = typer.Option(
        False, "--no-batching", help="Run each node's forward passes alone (the unbatched reference)."
    ),
    max_batch_tokens: int = typer.Option(
        MAX_BATCH_TOKENS, help="Tokens one engine step runs per replica: every decode plus pending prefill chunks."
    ),
    memory_price: float = typer.Option(
        0.0,
        help="Seconds placement charges per GiB of KV a decision adds to a replica: a context is copied to "
        "another replica only where that saves more (0 = time only).",
    ),
    linear_kernel: str = typer.Option(
        "auto",
        help="What the replicas' linear layers run on: torch (its own BLAS), onednn, or auto "
        "(each replica times both at start and keeps oneDNN where it is clearly faster).",
    ),
    replace: bool = typer.Option(
        False, "--replace", help="Shut down a running deployment of other settings instead of refusing."
    ),
    detach: bool = typer.Option(
        False,
        "--detach",
        help="Leave the deployment running and return (else serve until Ctrl-C, SIGTERM or SIGHUP, then stop it).",
    ),
    min_nodes: int = typer.Option(
        0, help="Wait (up to 5 minutes) until this many Ray nodes are alive before placing replicas."
    ),
    recalibrate: bool = typer.Option(
        False,
        "--recalibrate",
        help="On a running deployment, measure every cost and link again (default: only a restarted replica's).",
    ),
    snapshot_dir: str = typer.Option(
        "", help="Where the KV manager snapshots its catalog ('' = $GRAPHFLOW_CACHE/manager-snapshot)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Start the KV manager and N replica actors (named, so clients can attach)."""
    from graphflow.client import CALIBRATION_KEY, calibrate_cluster
    from graphflow.models.fetch import cache_root
    from graphflow.models.registry import resolve
    from graphflow.runtime.actors import HEAD_KEY, RayCluster
    from graphflow.runtime.cluster import (
        connect,
        forking_proxy,
        head_record,
        running_head,
        start_head,
        stop_head,
        wait_for_nodes,
    )
    from graphflow.runtime.cluster import shutdown as disconnect
    from graphflow.runtime.deployment import Deployment, gpus_for

    resolve(model)
    if min_nodes < 0:
        raise ValueError(f"--min-nodes must be 0 or more, got {min_nodes}")
    if min_nodes > 1 and not address:
        raise ValueError("--min-nodes above 1 needs --address (a cluster workers join); a local head is one node")
    prefault = capacity_mib << 20 if prefault_mib < 0 else prefault_mib << 20
    want = Deployment(
        model,
        replicas,
        kv_mode,
        capacity_mib << 20,
        transport,
        device,
        gpus_for(device, gpus_per_replica),
        recompute_head,
        threads,
        prefault,
        spread,
        not no_batching,
        max_batch_tokens,
        templates,
        recompute_fraction,
        memory_price,
        linear_kernel,
    )  # checks input, one sentence per mistake
    running = "" if address else running_head()  # NOTE: a second `serve` here: the deployment on it decides
    if running:
        try:
            connect("auto")
        except ConnectionError:
            raise ConnectionError(
                f"{running} answers, but not as a Ray head this machine can join; stop what listens on that port "
                "or serve on a Ray cluster with --address"
            ) from None
        say(f"a Ray head already runs on this machine ({running}); serving on it")
    head = address or running or start_head()
    started = not (address or running)  # this call started the head: it stops it when it fails or ends
    if not started and (why := forking_proxy(head)):
        say(why)
    try:
        ray = connect(address or "auto")
        if min_nodes:
            wait_for_nodes(ray, min_nodes, say=say)
        say(f"starting {replicas} replicas of {model}")
        snapshots = snapshot_dir or str(cache_root() / "manager-snapshot")
        cluster = RayCluster.start(ray, want, detached=True, snapshot_dir=snapshots, replace_existing=replace)
        if not (spread or threads) and sum(n.alive for n in cluster.nodes()) > 1:
            say(
                "on a cluster of several nodes Ray chose each replica's node, so each keeps every core of its host; "
                "--spread shares each node's cores among the replicas placed on it (or give --threads)"
            )
        previous = None if recalibrate else cluster.shared(CALIBRATION_KEY)
        say(
            "measuring prefill, decode-step and replica-to-replica transfer costs for the scheduler"
            + (" (what changed since the deployment's last calibration)" if previous is not None else "")
        )
        calibration = calibrate_cluster(cluster, previous)
        cluster.share(CALIBRATION_KEY, calibration)
        if started:  # NOTE: `shutdown` stops this head (and only from this machine); a given one is left
            cluster.share(HEAD_KEY, head_record(head))
    except BaseException:
        if started:  # NOTE: the head this call started serves nothing: leave no Ray behind
            disconnect()  # NOTE: first, or the driver prints the dying head's logs after the error
            stop_head(head)
        raise
    import time

    # NOTE: from here on a stop signal (Ctrl-C, SIGTERM, SIGHUP) stops what this call started, also
    # one that lands before the "serving until" line: a process group's SIGTERM right after that
    # line once ended the process outside this block, with the head it started left running
    try:
        with stopped_by_signal():
            stats = cluster.stats()  # NOTE: one round to every replica, for placement and kernels
            info = {
                "address": head,
                "client_address": client_address(head),
                "replicas": cluster.replicas,
                "placement": [{"replica": s.replica, "node": s.node, "host": s.host} for s in stats],
                "model": model,
                "kv_mode": kv_mode,
                "templates": templates,
                "snapshot_dir": snapshots,
                "transport": transport,
                "device": device,
                "batching": not no_batching,
                "max_batch_tokens": max_batch_tokens if not no_batching else 0,
                "memory_price_s_per_gib": memory_price,
                # what each replica's linear layers run on, as it chose at start (auto: measured)
                "linear_kernels": {s.replica: s.linear_kernel for s in stats},
                # how each replica's engine loop reads the stored prefixes its nodes continue
                "prefix_reading": {s.replica: s.prefix_reading for s in stats},
                "measured": list(calibration.measured_now),  # "costs" and "src>dst" pairs this call measured
                "links": calibration.links.measured(),
                # seconds of one engine-loop decode step per (context, rows); None: no engine loop (--no-batching)
                "decode_steps": asdict(steps) if (steps := calibration.policy.decode) is not None else None,
            }
            if json_out:
                emit(info)
            else:
                out.print(f"serving {model} on {replicas} replica{'s' if replicas != 1 else ''}; Ray head {head}")
                out.print(
                    f"submit with: RAY_AUTH_MODE=token graphflow submit --address {client_address(head)} --task '...'"
                )
            if detach:
                return
            say("serving until Ctrl-C (or SIGTERM)")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt as stop:  # NOTE: Ctrl-C, or SIGTERM / SIGHUP (its args name it)
        if detach:  # NOTE: a detached deployment outlives this call, whatever stops it
            raise
        cluster.shutdown()
        if started:  # NOTE: the head this call started: the next `serve` starts its own
            disconnect()
            stop_head(head)
        by = f" ({stop.args[0]})" if stop.args else ""
        say("stopped the replicas and the manager" + (", and the Ray head serve started" if started else "") + by)


@user_errors
def shutdown(
    address: str = typer.Option("auto", help="Ray address of the deployment."),
    stop_head: bool = typer.Option(
        True,
        help="Also stop the Ray head `graphflow serve` started, when run on that machine: its processes and "
        "workers only, not another Ray there (a head serve was given with --address is never stopped).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Stop the replicas and the manager (and the Ray head serve started, on its machine)."""
    from graphflow.runtime.actors import HEAD_KEY
    from graphflow.runtime.cluster import shutdown as disconnect
    from graphflow.runtime.cluster import started_here
    from graphflow.runtime.cluster import stop_head as stop

    try:
        cluster = attach(address)
        head = cluster.shared(HEAD_KEY)  # NOTE: read before the board goes with the deployment
        cluster.shutdown()
        stopped = cluster.replicas
    finally:
        disconnect()  # NOTE: leave the cluster before stopping it, or Ray logs errors after our output
    head_stopped = stop_head and started_here(head)
    if head_stopped:
        stop(head["address"])
    if json_out:
        emit({"stopped": stopped, "head_stopped": head_stopped})
        return
    out.print(f"stopped {len(stopped)} replicas and the manager")
    if head_stopped:
        out.print(f"stopped the Ray head serve started at {head['address']}")
    elif stop_head:
        why = (
            "started on another machine; `graphflow shutdown` there stops it"
            if head
            else "not started by `graphflow serve`; `ray stop` on its machine stops it"
        )
        out.print(f"left the Ray head running ({why})")


@user_errors
def demo(
    model: str = typer.Option("smollm2-135m", help="Model the replicas serve."),
    replicas: int = typer.Option(2, help="Replica actors."),
    tasks: int = typer.Option(2, help="Real tasks from the shared data to run."),
    decode: int = typer.Option(24, help="Tokens each node generates after its first (decode steps)."),
    branches: int = typer.Option(3, help="Parallel branches of the extra fan-out run (with 2+ replicas)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """The main job, embedded: real tasks through generated workflows on replica actors, plus
    one workflow of parallel branches the scheduler places over the replicas (it moves the task's
    KV over UCX where spreading pays); each run twice (KV reuse on / off) to show time, TTFT and
    prefill tokens saved."""
    from graphflow.checks.e2e import ReuseComparison, compare_reuse
    from graphflow.client import connect
    from graphflow.workflow.tasks import default_tasks_dir, task_text

    folder = Path(os.environ.get("GRAPHFLOW_TASKS", default_tasks_dir()))
    picked: list[str] = []
    for name in DEMO_TASK_FILES:
        lines = (folder / name).read_text().splitlines() if (folder / name).is_file() else []
        picked += [t for t in (task_text(json.loads(x)) for x in lines[: max(1, tasks // 2)]) if t]
    if not picked:
        raise ValueError(f"no demo tasks found in {folder}; set GRAPHFLOW_TASKS to a folder of *_validate.jsonl")
    say(f"starting {replicas} replicas of {model} on an embedded Ray")
    client = connect(None, model=model, replicas=replicas, decode_steps=decode)
    runs: list[tuple[str, Any]] = [(task, None) for task in picked[:tasks]]
    if replicas > 1:  # one workflow whose parallel branches the scheduler may spread over the replicas
        runs.append((picked[0], fan_out_workflow(branches)))
    summary: list[ReuseComparison] = []
    for i, (task, wf) in enumerate(runs):
        shape = "generated workflow" if wf is None else f"{branches} parallel branches"
        say(f"run {i + 1}/{len(runs)} ({shape}): with KV reuse, then without")
        compared, on = compare_reuse(client, task, wf, shape)
        if not json_out:
            out.print(trace_table(f"run {i + 1} ({shape}): {task[:60]!r}…", on))
            out.print(f"[bold]answer:[/] {on.final.strip()[:200]!r}")
        summary.append(compared)
    transport = sorted({s.transport for s in client.status()})
    if json_out:
        runs_json = [{"run": i + 1, **s.to_json()} for i, s in enumerate(summary)]
        emit({"model": model, "replicas": replicas, "transport": ",".join(transport), "runs": runs_json})
        return
    table = folding_table(
        "run",
        "workflow",
        "nodes",
        "replicas",
        "wall s (reuse / none)",
        "TTFT median (reuse / none)",
        "prefill tokens (reuse, root incl. / none)",
        "net saved",
        f"bytes moved ({','.join(transport)})",
        "same outputs",
        title="summary: KV reuse on vs off (measured; the root's prefill is charged to reuse)",
    )
    for i, s in enumerate(summary):
        table.add_row(
            str(i + 1),
            s.workflow,
            str(s.nodes),
            str(len(s.replicas_used)),
            f"{s.wall_s_reuse:.2f} / {s.wall_s_no_reuse:.2f}",
            f"{s.ttft_s_median_reuse:.3f} / {s.ttft_s_median_no_reuse:.3f} s",
            f"{s.prefill_tokens_reuse} / {s.prefill_tokens_no_reuse}",
            str(s.prefill_tokens_saved),
            f"{s.bytes_moved:,}",
            str(s.outputs_identical),
        )
    out.print(table)
