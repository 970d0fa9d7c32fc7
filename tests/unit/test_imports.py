"""The import graph of our three packages has no cycle, and the layers point one way:
``transport`` and ``scheduler`` import nothing of ``graphflow``; ``runtime`` imports nothing
from ``checks`` or ``bench``; ``kv`` does not import the engine. Every import counts,
including those inside functions (a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("graphflow", "transport", "scheduler")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(path: Path, known: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    # NOTE: a package's __init__ re-exporting its modules is not a dependency of those modules
    return {m: {d for d in _imports(p, known) if d != m and not m.startswith(d + ".")} for m, p in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return [*stack[stack.index(d) :], d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle():
    assert _cycle(_graph()) is None, " → ".join(_cycle(_graph()) or [])


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _edges(src: str, dst: str) -> list[tuple[str, str]]:
    return [(m, d) for m, ds in _graph().items() if m.startswith(src) for d in ds if d.startswith(dst)]


def test_layers_point_one_way():
    assert _edges("transport", "graphflow") == []
    assert _edges("scheduler", "graphflow") == [] and _edges("scheduler", "transport") == []
    assert _edges("graphflow.runtime", "graphflow.checks") == []
    assert _edges("graphflow.runtime", "graphflow.bench") == []
    assert _edges("graphflow.kv", "graphflow.models.engine") == []


def test_the_cli_starts_without_torch_or_transformers() -> None:
    """Every command's ``--help``, every bad option and every refused input answers at once:
    importing the CLI loads neither torch nor transformers (2 s here). Nor do the client, the
    actor classes and the types that cross the Ray boundary load torch: Ray's per-client server
    on the head imports them for each connected client (see ``runtime.replica_actor``);
    replicas import torch where they build a worker. Nor does planning a workflow import
    transformers or PyG (1.3–1.5 s): the generator's GCN layer is plain torch."""
    import subprocess
    import sys

    probe = (
        "import sys; import graphflow.cli; cli = {'torch', 'transformers'} & set(sys.modules); "
        "import graphflow.client, graphflow.runtime.actors, graphflow.kv.manager, graphflow.runtime.plan, "
        "graphflow.runtime.stats, graphflow.runtime.deployment, graphflow.kv.events; "
        "served = {'torch', 'transformers'} & set(sys.modules); "
        "import graphflow.workflow.planner; "
        "model = {m for m in sys.modules if m.split('.')[0] in ('transformers', 'torch_geometric')}; "
        "print(sorted(cli), sorted(served), sorted(model)[:3])"
    )
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert shown.stdout.strip() == "[] [] []", shown.stdout
