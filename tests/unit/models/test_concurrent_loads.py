from __future__ import annotations

import os
import subprocess
import sys

from tests.unit.test_imports import ROOT

# NOTE: the race is in the first import of transformers' model classes, so each try is a fresh
# process; two threads loading at once failed in 2 of 6 processes before the import lock
PROBE = """
import threading
from graphflow.models.engine import Engine
errors = []
def load():
    try:
        Engine.load("tiny-llama")
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=load) for _ in range(3)]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors)
"""


def test_threads_loading_models_at_once_in_a_fresh_process_all_succeed():
    for _ in range(3):
        run = subprocess.run(
            [sys.executable, "-c", PROBE],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        assert run.returncode == 0 and run.stdout.strip().splitlines()[-1] == "[]", (run.stdout, run.stderr[-2000:])
