"""Run the code a model wrote for an operation whose contract executes code (``PROGRAM``, ``TEST``).

The code runs in a separate, isolated Python process (``python -I``: no user site, no
environment-driven imports) with a wall-clock timeout and, where the OS allows, limits on
memory and CPU time. The entry point is the ``solve`` function the ``PROGRAM`` template asks
for; parameters it declares without defaults are passed ``None`` (models often write
``def solve(n):`` for a problem with no input). Without ``solve``, whatever the code prints is
the result. Nothing the code does reaches this process except its printed text.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["CodeResult", "extract_code", "run_solve"]

_FENCED = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)

# NOTE: the child reads the code from stdin and prints one marker line with the result, so
# prints of the model's code cannot be mistaken for the value.
_RUNNER = r"""
import inspect, sys
try:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (%(cpu)d, %(cpu)d))
except Exception as exc:
    sys.stderr.write("__GRAPHFLOW_LIMITS__ " + type(exc).__name__ + ": " + str(exc) + "\n")
src = sys.stdin.read()
ns = {"__name__": "__graphflow_solution__"}
exec(compile(src, "<model code>", "exec"), ns)
fn = ns.get("solve")
if callable(fn):
    try:
        params = inspect.signature(fn).parameters.values()
        args = [None for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        args = []
    value = fn(*args)
    print("\n__GRAPHFLOW_RESULT__ " + repr(value) if not isinstance(value, str) else "\n__GRAPHFLOW_RESULT__ " + value)
"""
_MARK = "__GRAPHFLOW_RESULT__ "
_LIMITS = "__GRAPHFLOW_LIMITS__ "


@dataclass(frozen=True, slots=True)
class CodeResult:
    ok: bool
    value: str  # solve()'s return value as text, or the code's printed output without solve
    error: str = ""  # the last line of the traceback, "timeout" or "no code"
    unlimited: str = ""  # why the 1 GiB memory and CPU-time limits could not be set ("" = they were)

    def as_text(self) -> str:
        return f"\nResult: {self.value}\n" if self.ok else f"\nError: {self.error}\n"


def extract_code(text: str) -> str | None:
    """The first fenced code block, else the text from the first ``def``/``import`` line on."""
    m = _FENCED.search(text)
    if m and m.group(1).strip():
        return m.group(1)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(("def ", "import ", "from ")):
            return "\n".join(lines[i:])
    return None


def run_solve(code: str | None, timeout_s: float = 5.0, max_chars: int = 2000) -> CodeResult:
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if not code or not code.strip():
        return CodeResult(False, "", "no code")
    runner = _RUNNER % {"cpu": max(1, int(timeout_s) + 1)}
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", runner], input=code, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return CodeResult(False, "", "timeout")
    unlimited, lines = _limits(proc.stderr)
    if proc.returncode != 0:
        error = (lines[-1] if lines else f"exit status {proc.returncode}")[:max_chars]
        return CodeResult(False, "", error, unlimited)
    out = proc.stdout
    at = out.rfind(_MARK)
    value = out[at + len(_MARK) :] if at >= 0 else out
    return CodeResult(True, value.strip()[:max_chars], "", unlimited)


def _limits(stderr: str) -> tuple[str, list[str]]:
    """(why the limits were not set, or ""; the other non-empty stderr lines)."""
    why, lines = "", []
    for line in stderr.strip().splitlines():
        if line.startswith(_LIMITS):
            why = line[len(_LIMITS) :].strip()
        elif line.strip():
            lines.append(line)
    return why, lines
