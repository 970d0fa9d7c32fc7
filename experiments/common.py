"""Helpers every study uses: run metadata and README tables generated from CSV."""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "add_provenance",
    "git_state",
    "guard_tree",
    "output_dir",
    "read_csv",
    "replace_section",
    "save_figure",
    "write_csv",
    "write_meta",
]

_PACKAGES = ("torch", "transformers", "ray", "pyarrow", "numpy", "torch-geometric", "ucxx-cu12", "mpi4py")


def git_state(root: Path) -> dict[str, Any]:
    """The commit, whether the tree differs from it (tracked or untracked files), and a hash of
    that difference when it does (so two dirty runs can be told apart)."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout
        except OSError:
            return ""

    status = git("status", "--porcelain")
    diff = git("diff", "HEAD") + status if status else ""
    return {
        "git_sha": git("rev-parse", "HEAD").strip(),
        "git_dirty": bool(status),
        "git_diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if status else "",
    }


_ROOT = Path(__file__).resolve().parents[1]
STARTED_AT = git_state(_ROOT)  # NOTE: taken when a study starts (imports this), not when it writes
_RUN = {"dirty_allowed": False}  # NOTE: set by guard_tree; write_meta and replace_section record it


def add_provenance(parser: argparse.ArgumentParser) -> None:
    """``--allow-dirty``, which every study that writes committed results takes."""
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write results although the tree has uncommitted changes (recorded in meta.json "
        "and shown under the generated tables)",
    )


def guard_tree(allow_dirty: bool, quick: bool = False) -> None:
    """Refuse a run that would write committed results from a tree with uncommitted changes,
    unless ``--allow-dirty`` (then meta.json and every generated table say so). ``--quick`` runs
    write under the ignored ``out/`` folders, so they may run from any tree."""
    dirty = bool(STARTED_AT["git_dirty"])
    if dirty and not allow_dirty and not quick:
        raise SystemExit(
            "the tree has uncommitted changes (see git status), so these results could not be traced to "
            "a commit: commit first, or pass --allow-dirty to write them marked as dirty"
        )
    _RUN["dirty_allowed"] = dirty and allow_dirty


def output_dir(folder: Path, quick: bool, sub: str = "") -> Path:
    """Where a run writes: ``folder/results[/sub]``, or for ``--quick`` the ignored
    ``folder/out/quick[-sub]`` (a quick check never overwrites committed results)."""
    if quick:
        return folder / "out" / ("quick-" + sub if sub else "quick")
    return folder / "results" / sub if sub else folder / "results"


def write_meta(folder: Path, **extra: Any) -> None:
    """``meta.json``: the git commit the study started from (and whether the tree was clean
    then), package versions, machine, plus study settings."""
    versions = {}
    for p in _PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            versions[p] = None
    meta = {
        **STARTED_AT,
        "allow_dirty": _RUN["dirty_allowed"],
        "packages": versions,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            **cpu_info(),
        },
        **extra,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").write_text(json.dumps(meta, indent=2))


CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # what moves matmul speed, bf16 most


def cpu_info(cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU's model name and which of ``CPU_FEATURES`` it has (the same bf16 prefill took 121 s
    on one 2-core machine and 40.6 s on another); empty where ``cpuinfo`` cannot be read."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return {}
    fields = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines()) if v
    )  # NOTE: the last processor's fields; every core of these machines is the same
    flags = set(fields.get("flags", "").split())
    return {"cpu_model": fields.get("model name", ""), "cpu_features": [f for f in CPU_FEATURES if f in flags]}


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def replace_section(readme: Path, name: str, body: str, heading: str = "") -> None:
    """Replace the text between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` (with a line
    saying so under ``body`` when the run was allowed to start from a dirty tree). Where the
    README has no such section, ``heading`` starts a new one at its end (a study run with
    settings of its own); without a heading that is an error."""
    if _RUN["dirty_allowed"]:
        body += (
            f"\n\n> **Dirty tree**: generated with `--allow-dirty` from {STARTED_AT['git_sha'][:10]} plus "
            f"uncommitted changes (diff sha256 {STARTED_AT['git_diff_sha256'][:12]})."
        )
    text = readme.read_text()
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    if begin not in text and heading:
        text = f"{text.rstrip()}\n\n{heading}\n\n{begin}\n{end}\n"
    if begin not in text:
        raise ValueError(f"{readme} has no {begin} marker")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{body}\n{end}{tail}")


def served_args(
    doc: str | None, configure: Callable[[argparse.ArgumentParser], None] = lambda _p: None
) -> argparse.Namespace:
    """A served study's command line (``--quick``, ``--json``, ``--allow-dirty`` and whatever
    ``configure`` adds), parsed, with the tree checked (:func:`guard_tree`)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny-llama, small sizes; writes out/quick-served/")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    configure(parser)
    add_provenance(parser)
    args = parser.parse_args()
    guard_tree(args.allow_dirty, args.quick)
    return args


def progress(as_json: bool) -> Callable[[str], None]:
    """Where a served study says what it is doing: stdout, or stderr under ``--json`` (whose
    stdout is the one JSON line)."""
    out = sys.stderr if as_json else sys.stdout
    return lambda m: print(f"… {m}", file=out, flush=True)


def publish_served(
    here: Path,
    name: str,
    result: dict[str, Any],
    settings: dict[str, Any],
    table: str,
    quick: bool,
    as_json: bool,
    sub: str = "served",
) -> None:
    """A served study's outputs: ``results/<sub>/<name>.json`` and ``meta.json`` (under
    ``out/quick-<sub>/`` for ``--quick``), the README's ``<sub>`` section from ``table`` (full
    runs only; a section the README lacks is added at its end, headed by the folder and the
    command), then the table or the JSON on stdout."""
    folder = output_dir(here, quick, sub)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(result, indent=2))
    module = f"experiments.{here.name}.served"
    write_meta(
        folder,
        command=f"python -m {module}" + (" --quick" if quick else ""),
        **{k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
    )
    if not quick:
        command = " ".join(["python -m", module, *sys.argv[1:]])
        heading = f"### `results/{sub}/`\n\n`{command}`, at {STARTED_AT['git_sha'][:7]}."
        replace_section(here / "README.md", sub, table, heading)
    print(json.dumps(result) if as_json else table)


def plot_main(
    doc: str | None, results: Path, csv_name: str, png_name: str, plot: Callable[[list[dict[str, str]], Path], None]
) -> None:
    """A study's ``plot.py`` command line: its CSV in, its PNG out (``--results`` picks the folder,
    e.g. a ``--quick`` run's ``out/quick``)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=results, help="folder holding the CSV; the PNG is written there")
    args = p.parse_args()
    plot(read_csv(args.results / csv_name), args.results / png_name)
    print(args.results / png_name)


def save_figure(fig: Any, png: Path) -> None:
    """Lay out, write and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
