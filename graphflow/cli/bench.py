"""``graphflow bench …``: benchmarks, medians after warm-up, measured here (``graphflow
calibrate`` and ``graphflow sweep …`` are in ``cli/sweep.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from graphflow.bench.transport_rows import PeerResult, TransportRow
from graphflow.cli._common import emit, folding_table, ints, names, out, say, user_errors
from graphflow.runtime.batch_limits import MAX_BATCH_TOKENS

app = typer.Typer(help="Benchmarks (medians after warm-up, measured here).", no_args_is_help=True)


@app.command("transport")
@user_errors
def bench_transport_cmd(
    backends: str = typer.Option("ucx,mpi,ray,local", help="Comma-separated backends."),
    sizes: str = typer.Option("1MiB,16MiB,64MiB,256MiB", help="Comma-separated transfer sizes."),
    block_bytes: str = typer.Option("1MiB", help="Bytes per KV block in our transfers."),
    iters: int = typer.Option(5, help="Back-to-back transfers per measurement."),
    repeats: int = typer.Option(3, help="Measurements per point (median reported)."),
    peers: str = typer.Option(
        "", help="Comma-separated peer libraries timed on the same plan: nixl, mooncake (the peers extra)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Our transfers vs each backend's raw reference, between two processes, same run (ucx and
    mpi also time the bare ceiling: the wire's data messages, hashed on arrival, no protocol);
    with --peers, NIXL and Mooncake move the same blocks and the ucx rows gain ours ÷ peer."""
    from graphflow.bench.transport import bench_transport, parse_size
    from graphflow.bench.transport_pair import BenchPlan

    plan = BenchPlan([parse_size(x) for x in sizes.split(",")], parse_size(block_bytes), iters, 2, repeats)
    rows, peer_results = bench_transport(names(backends), plan, say=say, peers=names(peers))
    if json_out:
        emit({"rows": [r.to_json() for r in rows], "peers": [p.to_json() for p in peer_results]})
        return
    table = folding_table(
        "backend",
        "bytes",
        "blocks",
        "ours GB/s",
        "raw GB/s",
        "ratio",
        "overhead µs",
        "bare ratio",
        "ours ÷ bare",
        title="transport",
    )
    for r in rows:
        table.add_row(
            r.backend,
            f"{r.nbytes:,}",
            str(r.blocks),
            f"{r.ours_gbps:.2f}",
            f"{r.raw_gbps:.2f}",
            f"{r.ratio:.2f}",
            f"{r.overhead_us:.0f}",
            _maybe(r.bare_ratio),  # NOTE: ucx and mpi rows only
            _maybe(r.ours_over_bare),
        )
    out.print(table)
    if peer_results:
        out.print(_peer_table(rows, peer_results))


def _maybe(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _peer_table(rows: list[TransportRow], peers: list[PeerResult]) -> Table:
    """One line per peer × size: its GB/s beside ours over UCX, or why the peer could not run."""
    ours = {r.nbytes: r.ours_gbps for r in rows if r.backend == "ucx"}
    table = folding_table("peer", "bytes", "peer GB/s", "ours ucx GB/s", "ours ÷ peer", "checksums", title="peers")
    for p in peers:
        if p.unavailable:
            table.add_row(p.peer, "—", "—", "—", "—", escape(p.unavailable))
            continue
        for r in p.rows:
            mine = ours.get(r.nbytes)
            ratio = _maybe(mine / r.peer_gbps if mine else None)
            checks = "yes" if r.checksums else "none"
            table.add_row(p.peer, f"{r.nbytes:,}", f"{r.peer_gbps:.2f}", _maybe(mine), ratio, checks)
    return table


@app.command("verify-ceiling")
@user_errors
def bench_verify_ceiling_cmd(
    sizes: str = typer.Option("16MiB,64MiB,256MiB", help="Comma-separated transfer sizes."),
    block_bytes: str = typer.Option("1MiB", help="Bytes per checksummed block."),
    repeats: int = typer.Option(15, help="Timed runs per point (median reported)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """What checksum verification costs the receiving core: copy vs copy-then-hash vs hashing in cache."""
    from graphflow.bench.transport import parse_size
    from graphflow.bench.verify_ceiling import verify_ceiling

    rows = verify_ceiling([parse_size(x) for x in sizes.split(",")], parse_size(block_bytes), repeats, say)
    if json_out:
        emit({"rows": [r.to_json() for r in rows]})
        return
    table = folding_table(
        "bytes",
        "copy GB/s",
        "copy then hash",
        "copy and hash (in cache)",
        "same, two threads",
        "copy next to a hash",
        "that hash GB/s",
        title="verification ceiling (ratio to the copy alone)",
    )
    for r in rows:
        table.add_row(
            f"{r.nbytes:,}",
            f"{r.copy_gbps:.2f}",
            f"{r.ratio_copy_then_hash:.2f}",
            f"{r.ratio_copy_and_hash:.2f}",
            f"{r.ratio_copy_and_hash_shared:.2f}",
            f"{r.copy_slowdown_contended:.2f}",
            f"{r.contending_hash_gbps:.1f}",
        )
    out.print(table)


@app.command("catalog")
@user_errors
def bench_catalog_cmd(
    blocks: int = typer.Option(1_000_000, help="Blocks to register."),
    blocks_per_state: int = typer.Option(1024, help="Blocks per admit event (one state each)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Register, look up, snapshot and restore a catalog of BLOCKS blocks."""
    from graphflow.bench.catalog import bench_catalog

    result = bench_catalog(blocks, blocks_per_state, say=say)
    if json_out:
        emit(result.to_dict())
        return
    table = folding_table("metric", "value", title=f"catalog: {blocks:,} blocks")
    for k, v in result.to_dict().items():
        table.add_row(k, f"{v:,.2f}" if isinstance(v, float) else f"{v:,}")
    out.print(table)


@app.command("manager-life")
@user_errors
def bench_manager_life_cmd(
    nodes: str = typer.Option("2000,10000,30000", help="Comma-separated node counts to measure at."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """The KV manager over a deployment's life: catalog rows, state records kept and snapshot
    time after each count of nodes served, with runs ended (as the executor does) and without."""
    from graphflow.bench.manager_life import bench_manager_life

    rows = bench_manager_life(ints(nodes, "--nodes"), say=say)
    if json_out:
        emit({"rows": [r.to_dict() for r in rows]})
        return
    table = folding_table("runs ended", "nodes", "catalog rows", "live blocks", "states kept", "snapshot s")
    for r in rows:
        table.add_row(
            "yes" if r.runs_ended else "no",
            f"{r.nodes:,}",
            f"{r.catalog_rows:,}",
            f"{r.live_blocks:,}",
            f"{r.states_kept:,}",
            f"{r.snapshot_s:.3f}",
        )
    out.print(table)


@app.command("submit")
@user_errors
def bench_submit_cmd(
    address: str = typer.Option(..., help="Ray client address of a `graphflow serve` deployment (ray://host:10001)."),
    task: str = typer.Option("", help="The task each submit runs (or --tasks-file)."),
    tasks_file: Path | None = typer.Option(
        None,
        "--tasks-file",
        help="A file of tasks, one per line (as `submit --tasks-file` reads it), each submit runs.",
    ),
    decode: int = typer.Option(8, help="Tokens each node generates after its first (decode steps)."),
    submits: int = typer.Option(5, help="Submits measured, one after another."),
    warmup: int = typer.Option(1, help="Submits run first and left out of the medians."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """What one `graphflow submit` costs end to end: each submit a process of its own (start-up,
    imports, a new Ray client, its tasks, exit), its wall time split into the tasks' time and the
    rest; the outputs of every submit compared."""
    from graphflow.bench.submit import bench_submit, submit_command
    from graphflow.cli.submit import submitted_tasks

    submitted_tasks(task, tasks_file, 1)
    report = bench_submit(submit_command(address, task, tasks_file, decode), submits, warmup, say=say)
    if json_out:
        emit(report.to_dict())
        return
    table = folding_table("#", "warm-up", "wall s", "tasks s", "rest s")
    for r in report.rows:
        table.add_row(
            str(r.index + 1), "yes" if r.warmup else "", f"{r.wall_s:.2f}", f"{r.run_s:.2f}", f"{r.outside_s:.2f}"
        )
    out.print(table)
    out.print(
        f"median of {submits}: {report.median_wall_s:.2f} s a submit "
        f"({report.min_wall_s:.2f}–{report.max_wall_s:.2f}), "
        f"tasks {report.median_run_s:.2f} s, the rest {report.median_outside_s:.2f} s; "
        + ("the same outputs every time" if report.same_outputs else "the outputs differed between submits")
    )


@app.command("prefill")
@user_errors
def bench_prefill_cmd(
    model: str = typer.Option("tiny-llama", help="Registry name or local checkpoint folder."),
    tokens: str = typer.Option("512,2048,8192", help="Comma-separated context lengths."),
    repeats: int = typer.Option(3, help="Timed runs per length (after one warm-up)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Median prefill time per context length and measured KV bytes per token."""
    from graphflow.bench.prefill import bench_prefill
    from graphflow.models.engine import Engine

    lengths = ints(tokens, "--tokens")
    engine = Engine.load(model, say=say)
    rows = bench_prefill(engine, lengths, repeats, say=say)
    if json_out:
        emit({"model": model, "device": str(engine.device), "rows": [r.to_dict() for r in rows]})
        return
    table = folding_table(
        "tokens", "prefill s (median)", "min", "max", "tokens/s", "KV bytes/token", title=f"prefill: {model}"
    )
    for r in rows:
        table.add_row(
            str(r.tokens),
            f"{r.prefill_s_median:.4f}",
            f"{r.prefill_s_min:.4f}",
            f"{r.prefill_s_max:.4f}",
            f"{r.tokens_per_s:,.0f}",
            f"{r.kv_bytes_per_token:,.0f}",
        )
    out.print(table)


@app.command("multi-agent")
@user_errors
def bench_multi_agent_cmd(
    model: str = typer.Option("smollm2-135m", help="Model both replicas serve."),
    agents: str = typer.Option("1,2,4,8,16", help="Comma-separated agent counts over one root."),
    root_tokens: int = typer.Option(4096, help="The shared root context's tokens."),
    decode: int = typer.Option(32, help="Tokens each agent generates."),
    threads: int = typer.Option(1, help="Torch threads per replica."),
    repeats: int = typer.Option(
        1, help="Trials per (agents, system), the systems taking turns; the median makespan's is kept."
    ),
    systems: str = typer.Option("ours,ideal,dense,local,routed,holder", help="Systems to run; ours must be one."),
    memory: bool = typer.Option(
        True,
        "--memory/--no-memory",
        help="Measure each trial's peak memory growth (hands freed memory, recycled receive buffers "
        "included, back to the OS before each trial; --no-memory times the replicas in steady state).",
    ),
    memory_price: float = typer.Option(
        0.0, help="The deployment's memory price: seconds placement charges per GiB of KV a decision adds (serve's)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """k agents over one root through the served path (embedded Ray, two replicas): ours, an
    ideal measured on its own (the root's prefill in its own trial, then the agents on replicas
    that all hold it, nothing moved), dense (reuse off) and three prefix-caching baselines that
    never move KV (local: round-robin replicas; routed: cache-aware placement; holder: every
    agent on the replica holding the root), same run."""
    from graphflow.bench.multi_agent import run_multi_agent_bench
    from graphflow.bench.serve_report import calibration_line

    result = run_multi_agent_bench(
        model,
        ints(agents, "--agents"),
        root_tokens,
        decode,
        threads,
        repeats,
        say=say,
        systems=names(systems),
        memory=memory,
        memory_price=memory_price,
    )
    if json_out:
        emit(result.to_json())
        return
    columns = ["agents", "system", "root prefill s", "agents s", "makespan s", "bytes moved", "decisions"]
    table = folding_table(
        *columns,
        *(["every repeat's makespan s"] if repeats > 1 else []),
        title=f"bench multi-agent: {model}, {root_tokens}-token root"
        + (f", memory priced {memory_price:g} s/GiB" if memory_price else ""),
    )
    for r in result.rows:
        table.add_row(
            str(r.agents),
            r.system,
            f"{r.root_prefill_s:.2f}",
            f"{r.agents_s:.2f}",
            f"{r.makespan_s:.2f}",
            f"{r.bytes_moved:,}",
            json.dumps(r.decisions),
            *([" / ".join(f"{m:.2f}" for m in r.makespans_s)] if repeats > 1 else []),
        )
    out.print(table)
    ratios = {
        "ideal ÷ ours": result.efficiency,
        "dense ÷ ours": result.dense_over_ours,
        "better prefix caching ÷ ours": result.prefix_caching_over_ours,
    }
    for k in sorted({r.agents for r in result.rows}):
        said = [f"{name} {v[k]:.3f}" for name, v in ratios.items() if k in v]
        out.print(f"{k} agents: {', '.join(said) or 'ours only'}")
    if result.calibration:
        out.print(calibration_line(result.calibration))


@app.command("serve")
@user_errors
def bench_serve_cmd(
    model: str = typer.Option("smollm2-135m", help="Model every replica serves."),
    replicas: int = typer.Option(2, help="Replica actors of the embedded deployment."),
    workflows: str = typer.Option("1,4,16", help="Comma-separated counts of concurrent workflows."),
    root_tokens: int = typer.Option(1024, help="Each workflow's context, computed upstream on replica 0."),
    agents: int = typer.Option(2, help="Agent nodes per workflow."),
    decode: int = typer.Option(32, help="Tokens each agent generates."),
    threads: int = typer.Option(1, help="Torch threads per replica (the scripted job uses 1)."),
    max_batch_tokens: int = typer.Option(MAX_BATCH_TOKENS, help="Tokens one engine step runs (batching on)."),
    memory_agents: int = typer.Option(16, help="Agents over one shared root for the memory rows (0 = skip)."),
    memory_root: int = typer.Option(4096, help="That shared root's tokens."),
    hol_prefill: int = typer.Option(4096, help="Long prefill a short node arrives during (0 = skip)."),
    no_batching: bool = typer.Option(False, "--no-batching", help="Only the unbatched served path."),
    no_reference: bool = typer.Option(False, "--no-reference", help="Only the batched path (no unbatched rows)."),
    scripted: bool = typer.Option(False, "--scripted", help="Also run the scripted agents job (largest count)."),
    baselines: str = typer.Option(
        "", help="Also run the batched workload as: dense, local, routed, holder (graphflow.bench.systems)."
    ),
    memory: bool = typer.Option(
        True,
        "--memory/--no-memory",
        help="Measure each throughput row's peak memory growth in a trial of its own after the timed "
        "ones (the timed trials run in steady state either way; the shared-root rows always measure).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """The served path end to end (embedded Ray): tokens/s and TTFT under concurrent workflows,
    peak memory of agents over one root, a short node's TTFT during a long prefill; batching
    on and off in the same run."""
    from graphflow.bench.serve import run_serve_bench
    from graphflow.bench.serve_report import calibration_line

    if no_batching and no_reference:
        raise ValueError("--no-batching and --no-reference leave nothing to run; pass at most one")
    modes = (False,) if no_batching else (True,) if no_reference else (True, False)
    result = run_serve_bench(
        model,
        replicas,
        ints(workflows, "--workflows"),
        root_tokens,
        agents,
        decode,
        modes,
        threads,
        max_batch_tokens,
        memory_agents,
        memory_root,
        hol_prefill,
        scripted,
        say=say,
        baselines=names(baselines),
        row_memory=memory,
    )
    if json_out:
        emit(result.to_json())
        return
    table = folding_table(
        "system",
        "batching",
        "workflows",
        "agents",
        "tok/s",
        "TTFT p50 s",
        "TTFT p99 s",
        "peak RSS MiB",
        "KV MiB",
        "rows/step",
        "engine busy",
        "cores: replicas / other",
        title=f"bench serve: {model}",
    )
    for r in result.rows:
        table.add_row(
            r.system,
            "on" if r.batching else "off",
            str(r.workflows),
            str(r.agents),
            f"{r.tokens_per_s:.1f}",
            f"{r.ttft_p50_s:.3f}",
            f"{r.ttft_p99_s:.3f}",
            f"{r.peak_rss_bytes / 2**20:.0f}" if result.row_memory else "—",
            f"{r.kv_bytes / 2**20:.0f}",
            f"{r.rows_per_step:.1f}" if r.batching else "—",
            f"{r.engine_share:.0%}" if r.batching else "—",
            f"{r.replica_cores:.2f} / {r.other_cores:.2f}",
        )
    out.print(table)
    for w, x in result.speedup_vs_unbatched.items():
        out.print(f"{w} workflows: {x:.2f}× the unbatched served path")
    for system in sorted({r.system for r in result.rows} - {"ours"}):
        for w, x in result.ours_over(system).items():
            out.print(f"{w} workflows: ours {x:.2f}× {system} (batched, tokens/s)")
    if result.scripted_tokens_per_s is not None:
        out.print(
            f"the scripted agents job (not the served path), same workload: {result.scripted_tokens_per_s:.1f} tok/s"
        )
    for c in result.calibrations:
        out.print(calibration_line(c))
    for m in result.memory:
        mode = f"batching {'on' if m.batching else 'off'}, reuse {'on' if m.reuse else 'off (dense)'}"
        out.print(
            f"{m.agents} agents over {m.root_tokens} tokens, {mode}: peak growth {m.peak_rss_bytes / 2**20:.0f} MiB"
        )
    for h in result.head_of_line:
        out.print(
            f"short node TTFT p99, batching {'on' if h.batching else 'off'}: idle {h.idle_p99_s:.3f} s, "
            f"during a {h.prefill_tokens}-token prefill {h.loaded_p99_s:.3f} s "
            f"({h.ratio_p99:.2f}×, {len(h.loaded_ttft_s)} samples, {h.pauses} steps paused for them)"
        )
