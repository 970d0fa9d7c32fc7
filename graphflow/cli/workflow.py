"""Workflow-layer commands: ``graphflow wgraph build``, ``train generator``, ``generate`` and
``eval generator``."""

from __future__ import annotations

import csv
from pathlib import Path

import typer

from graphflow.cli._common import emit, folding_table, out, say, user_errors

__all__ = ["eval_app", "generate", "train_app", "wgraph_app"]

wgraph_app = typer.Typer(help="Build and inspect the wGraph.", no_args_is_help=True)
train_app = typer.Typer(help="Train models.", no_args_is_help=True)
eval_app = typer.Typer(help="Evaluate models.", no_args_is_help=True)


@wgraph_app.command("build")
@user_errors
def wgraph_build(
    corpus: Path = typer.Option(None, help="AFlow facts JSON (default: shared/data/workflows)."),
    yaml: list[Path] = typer.Option([], help="Extra user workflows in YAML (repeatable)."),
    out_path: Path = typer.Option(Path("wgraph.parquet"), "--out", help="Parquet file to write."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Merge the workflow corpus (and YAML workflows) into the wGraph and save it."""
    from graphflow.workflow.corpus import load_corpus, load_yaml_workflows
    from graphflow.workflow.wgraph import WGraph

    workflows = load_corpus(corpus) + [w for y in yaml for w in load_yaml_workflows(y)]
    g = WGraph.build(workflows)
    g.write_parquet(out_path)
    usable = [w for w in workflows if not w.failed]
    summary = {
        "operations": len(g.ops),
        "edges": len(g.edges),
        "workflows": len(usable),
        "all_contained": all(g.contains(w) for w in usable),
        "path": str(out_path),
    }
    if json_out:
        emit(summary)
        return
    table = folding_table(
        "#", "operator", "role", "depth", "→", title=f"wGraph: {len(g.ops)} ops, {len(g.edges)} edges"
    )
    for i, k in enumerate(g.ops):
        table.add_row(str(i), k[0], k[1], str(k[2]), ", ".join(str(d) for s, d in g.edges if s == i))
    out.print(table)


@train_app.command("generator")
@user_errors
def train_generator(
    tasks: Path = typer.Option(None, help="Folder of <benchmark>_<split>.jsonl (default: shared/data/tasks)."),
    corpus: Path = typer.Option(None, help="AFlow facts JSON (default: shared/data/workflows)."),
    epochs: int = typer.Option(30, help="Imitation epochs."),
    per_benchmark: int = typer.Option(80, help="Training tasks sampled per benchmark."),
    out_path: Path = typer.Option(None, "--out", help="Checkpoint path (default: the packaged one)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Train the GNN + MLP generator by imitation on every benchmark's reference workflow."""
    from graphflow.workflow.corpus import load_corpus, references
    from graphflow.workflow.evaluate import sample_tasks
    from graphflow.workflow.planner import DEFAULT_CHECKPOINT, Planner
    from graphflow.workflow.tasks import load_tasks
    from graphflow.workflow.train import TrainConfig, imitation
    from graphflow.workflow.wgraph import WGraph

    wfs = load_corpus(corpus)
    refs = references(wfs)
    sample = sample_tasks([t for t in load_tasks(tasks) if t.benchmark in refs], per_benchmark, 0)
    planner = Planner(WGraph.build(wfs))
    say(f"training on {len(sample)} tasks for {epochs} epochs")
    losses = imitation(planner, [(t.text, refs[t.benchmark]) for t in sample], TrainConfig(epochs=epochs))
    path = out_path or DEFAULT_CHECKPOINT
    planner.save(path)
    result = {
        "tasks": len(sample),
        "epochs": epochs,
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "checkpoint": str(path),
        "bytes": path.stat().st_size,
    }
    emit(result) if json_out else out.print(result)


@user_errors
def generate(
    task: str = typer.Option(..., help="The task's text."),
    checkpoint: Path = typer.Option(None, help="Generator checkpoint (default: the packaged one)."),
    templates: str = typer.Option("short", help="Operation templates to compile with: short or detailed."),
    out_path: Path | None = typer.Option(
        None, "--out", help="Write the workflow as YAML there (what `graphflow submit --workflow` runs)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Generate a workflow for a task and compile it to the stateful execution graph."""
    from graphflow.workflow.compile import compile_workflow
    from graphflow.workflow.corpus import workflows_yaml
    from graphflow.workflow.planner import DEFAULT_CHECKPOINT, Planner

    planner = Planner.load(checkpoint or DEFAULT_CHECKPOINT)
    wf = planner.generate(task)
    gs = compile_workflow(wf, templates)
    if out_path is not None:
        out_path.write_text(workflows_yaml([wf]))
        say(f"wrote the workflow to {out_path}")
    result = {
        "templates": templates,
        "workflow_file": str(out_path) if out_path is not None else None,
        "nodes": [
            {
                "id": n.id,
                "operator": n.operator,
                "role": n.role,
                "state_parent": n.state_parent,
                "template_chars": len(n.template),
            }
            for n in gs.nodes
        ],
        "data_edges": [list(e) for e in gs.data_edges],
        "state_edges": [list(e) for e in gs.state_edges],
        "outputs": list(gs.outputs),
    }
    if json_out:
        emit(result)
        return
    table = folding_table("node", "operation", "inputs", "KV state extends", title="generated workflow")
    for n in gs.nodes:
        table.add_row(n.id, f"{n.operator}/{n.role}", ", ".join(n.preds) or "task", n.state_parent)
    out.print(table)


@eval_app.command("generator")
@user_errors
def eval_generator(
    tasks: Path = typer.Option(None, help="Folder of <benchmark>_<split>.jsonl (default: shared/data/tasks)."),
    corpus: Path = typer.Option(None, help="AFlow facts JSON (default: shared/data/workflows)."),
    per_benchmark: int = typer.Option(40, help="Test tasks per left-out benchmark."),
    epochs: int = typer.Option(20, help="Imitation epochs per fold and variant."),
    csv_out: Path = typer.Option(None, "--csv", help="Write per-task rows here."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Leave-one-benchmark-out and recombination evaluation with bootstrap intervals."""
    from graphflow.workflow.corpus import load_corpus
    from graphflow.workflow.evaluate import EvalSettings, evaluate_generator
    from graphflow.workflow.tasks import load_tasks

    settings = EvalSettings(tasks_per_benchmark=per_benchmark, train_tasks_per_benchmark=per_benchmark, epochs=epochs)
    result = evaluate_generator(load_tasks(tasks), load_corpus(corpus), settings, say=say)
    rows = result.csv_rows()
    if csv_out:
        csv_out.parent.mkdir(parents=True, exist_ok=True)
        with open(csv_out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if json_out:
        emit(result.to_json())
        return
    for part, data in result.parts.items():
        table = folding_table(
            "method",
            "edge F1",
            "95% CI",
            "upper bound",
            "exact",
            "node J",
            "valid",
            "ms/task",
            title=f"{part}: {', '.join(data.benchmarks)} ({data.tasks} tasks)",
        )
        for name, m in data.methods.items():
            lo, hi = m.edge_f1_ci
            table.add_row(
                name,
                f"{m.edge_f1:.3f}",
                f"[{lo:.3f}, {hi:.3f}]",
                f"{m.upper_bound:.3f}",
                f"{m.exact_match:.2f}",
                f"{m.node_jaccard:.2f}",
                f"{m.validity:.2f}",
                f"{m.ms_per_task:.2f}",
            )
        out.print(table)
