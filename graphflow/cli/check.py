"""``graphflow check …``: end-to-end correctness checks (exact resume, fork, lineage, faults,
transfer, e2e)."""

from __future__ import annotations

import typer

from graphflow.cli._common import emit, folding_table, kv_table, out, say, trace_table, user_errors

app = typer.Typer(help="End-to-end correctness checks.", no_args_is_help=True)


@app.command("exact")
@user_errors
def check_exact(
    model: str = typer.Option("tiny-llama", help="Registry name or local checkpoint folder."),
    tokens: int = typer.Option(256, help="Prompt tokens to prefill."),
    steps: int = typer.Option(16, help="Greedy decode steps after resuming."),
    block_tokens: int = typer.Option(16, help="Tokens per KV block."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Pack a prefilled cache into blocks, resume decoding in a fresh process, compare bit for bit."""
    from graphflow.checks.exact import run_exact_check

    result = run_exact_check(model, tokens, steps, block_tokens, say=say)
    if json_out:
        emit(result.to_dict())
        return
    table = folding_table("", "value", title=f"exact resume: {model}, {tokens} tokens → {steps} decoded")
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


@app.command("fork")
@user_errors
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
    result = run_fork_check(model, tokens, branches, decode, say=say)
    if json_out:
        emit(result.to_dict())
    else:
        kv_table(f"fork: {tokens} shared tokens × {branches} branches", result.to_dict())


@app.command("lineage")
@user_errors
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
    result = run_lineage_check(model, states, tokens, say=say)
    if json_out:
        emit(result.to_dict())
    else:
        kv_table("lineage: evict and rebuild", result.to_dict())
    if not result.rebuilt_bit_identical:
        raise typer.Exit(1)


@app.command("faults")
@user_errors
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
    from graphflow.checks.fault_report import NODE_SCENARIOS, SCENARIOS
    from graphflow.checks.faults import run_faults
    from graphflow.models.registry import resolve

    resolve(model)
    if load < 1:
        raise ValueError(f"--load must be at least 1, got {load}")
    chosen = tuple(scenario) or (SCENARIOS + NODE_SCENARIOS if nodes else SCENARIOS)
    result = run_faults(model, chosen, load, timeout, say=say, nodes=nodes)
    if json_out:
        emit(result.to_json())
    else:
        table = folding_table("scenario", "completed", "outputs correct", "seconds", "detail", title="fault scenarios")
        for r in result.rows:
            table.add_row(r.name, str(r.completed), str(r.outputs_correct), f"{r.seconds:.1f}", r.detail)
        out.print(table)
        out.print(f"{result.passed}/{len(result.rows)} passed; lost requests: {result.lost_requests}")
    if not result.ok:
        raise typer.Exit(1)


@app.command("transfer")
@user_errors
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
    from transport.registry import check_backend

    resolve(model)
    check_backend(backend)
    say(f"moving a {tokens}-token KV state of {model} over {backend}")
    result = run_transfer_check(backend, TransferCheck(model=model, tokens=tokens), timeout)
    got = result.received
    if json_out:
        emit(result.to_json())
        return
    table = folding_table("", "value", title=f"KV transfer over {backend}: {model}, {tokens} tokens")
    table.add_row("processes", str(result.processes))
    table.add_row("blocks / bytes", f"{got.blocks} / {got.nbytes:,}")
    table.add_row("receive seconds", f"{got.seconds:.4f}")
    table.add_row("tokens equal after resume", "[green]yes[/]" if got.tokens_equal else "[red]NO[/]")
    table.add_row("max |Δ logit| vs sender", f"{got.max_abs_logit_diff:.3g}")
    out.print(table)
    if not got.tokens_equal:
        raise typer.Exit(1)


@app.command("e2e")
@user_errors
def check_e2e(
    replicas: int = typer.Option(2, help="Replica actors."),
    branches: int = typer.Option(4, help="Parallel branches of the workflow."),
    model: str = typer.Option("tiny-llama", help="Registry name."),
    decode: int = typer.Option(8, help="Tokens each node generates after its first (decode steps)."),
    context_repeats: int = typer.Option(24, help="Task context length, in repeats of a ~180-char problem."),
    transport: str = typer.Option("ucx", help="How the replicas move KV: ucx or ray."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """A workflow with parallel branches on replica actors, exact mode vs all reuse off.

    The branches are pinned to the replicas in turn, the task context to the first; the context
    is long enough (~4K tokens on the byte-level test models) that moving its KV beats
    recomputing it on the others, as measured at connect time."""
    from graphflow.checks.e2e import run_e2e_check
    from graphflow.client import connect
    from graphflow.models.registry import resolve

    resolve(model)
    client = connect(None, model=model, replicas=replicas, decode_steps=decode, transport=transport)
    result, exact = run_e2e_check(client, branches, context_repeats)
    if json_out:
        emit(result.to_json())
    else:
        out.print(trace_table("exact mode", exact))
        kv_table("exact mode vs reuse off", {k: v for k, v in result.to_json().items() if k != "decisions"})
    if not result.passed:
        raise typer.Exit(1)
