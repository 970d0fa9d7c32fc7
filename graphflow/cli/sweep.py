"""``graphflow calibrate`` (the scheduler's cost profile, measured here) and ``graphflow sweep …``
(transfer vs recompute, here or between a deployment's replicas)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from graphflow.cli._common import emit, ints, kv_table, say, user_errors

__all__ = ["calibrate_cmd", "sweep_app"]

sweep_app = typer.Typer(help="Sweeps users run on their cluster.", no_args_is_help=True)


@user_errors
def calibrate_cmd(
    model: str = typer.Option("tiny-llama", help="Registry name or local checkpoint folder."),
    backends: str = typer.Option("ucx,mpi,local", help="Links to probe (two processes for ucx and mpi)."),
    out_path: Path = typer.Option(Path("profile.json"), "--out", help="Profile file to write."),
    repeats: int = typer.Option(3, help="Timed repetitions per point (median)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Measure prefill, cache rebuild, template rebuild (base + residual) and transport links; write the
    scheduler's profile."""
    from dataclasses import asdict

    from graphflow.bench.calibration import calibrate
    from graphflow.models.registry import resolve

    resolve(model)
    prof = calibrate(model, [b for b in backends.split(",") if b], out_path, repeats, say=say)
    result = {
        "profile": str(out_path),
        "model": prof.model,
        "prefill": asdict(prof.prefill),
        "resume": asdict(prof.resume),
        "links": {k: {"gbps": v.gbps, "latency_s": v.latency_s} for k, v in prof.links.items()},
        "reconstruct": asdict(prof.reconstruct) if prof.reconstruct else None,
    }
    if json_out:
        emit(result)
    else:
        kv_table(f"profile for {model} → {out_path}", {k: json.dumps(v) for k, v in result.items()})


@sweep_app.command("transfer-vs-recompute")
@user_errors
def sweep_transfer_vs_recompute(
    model: str = typer.Option("smollm2-135m", help="Registry name or local checkpoint folder."),
    contexts: str = typer.Option("256,1024,4096,8192", help="Context lengths (a fixed grid)."),
    backends: str = typer.Option("ucx,mpi", help="Loopback backends to measure."),
    links: str = typer.Option("500,1000,2500,5000", help="Shaped tcp link rates in Mbit/s ('' for none)."),
    repeats: int = typer.Option(3, help="Timed repetitions per point (median)."),
    out_dir: Path = typer.Option(Path("sweep-out"), "--out", help="Folder for sweep.csv and sweep.png."),
    address: str = typer.Option(
        "", help="A deployment's Ray client address: sweep between its served replicas ('' = two processes here)."
    ),
    pairs: str = typer.Option("", help="With --address: SOURCE:DESTINATION replica pairs ('' = every ordered pair)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Measure recompute vs transfer+resume and grade the scheduler: between two processes here
    (loopback and shaped links), or with --address between a deployment's replicas."""
    from graphflow.bench.sweep_run import run_deployment_sweep, run_sweep
    from graphflow.models.registry import resolve

    if address:
        result = run_deployment_sweep(address, model, ints(contexts, "--contexts"), pairs, out_dir, repeats, say=say)
        if json_out:
            emit(result.to_json())
        else:
            kv_table(f"transfer vs recompute on the deployment at {address}", result.to_json())
        return
    resolve(model)
    result = run_sweep(
        model,
        ints(contexts, "--contexts"),
        [b for b in backends.split(",") if b],
        [float(x) for x in links.split(",") if x],
        out_dir,
        repeats,
        say=say,
    )
    if json_out:
        emit(result.to_json())
    else:
        kv_table(f"transfer vs recompute: {model}", result.to_json())
