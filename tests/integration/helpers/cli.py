"""Run the ``graphflow`` command as a user would (a subprocess, token auth, offline hub)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ENV = {**os.environ, "RAY_AUTH_MODE": "token", "HF_HUB_OFFLINE": "1"}


def cli(
    *args: str, timeout: int = 600, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``graphflow ARGS`` (in ``env``, default :data:`ENV`); with ``check`` a non-zero exit
    fails the test with its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "graphflow.cli", *args], capture_output=True, text=True, env=env or ENV, timeout=timeout
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def last_json(proc: subprocess.CompletedProcess[str]) -> dict:
    """The JSON object a ``--json`` command prints as its last line."""
    return json.loads(proc.stdout.strip().splitlines()[-1])
