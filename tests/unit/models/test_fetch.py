"""SmolLM2's one-time conversion when several processes ask for it at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from graphflow.models import fetch


def test_replicas_starting_together_convert_once_and_never_remove_a_finished_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHFLOW_CACHE", str(tmp_path))
    calls: list[Path] = []

    def slow_convert(target: Path, say) -> None:
        calls.append(target)
        time.sleep(0.3)  # the others arrive while this one converts
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(fetch, "_convert", slow_convert)
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(fetch.ensure_smollm2())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 4 and len(set(got)) == 1
    assert (got[0] / "model.safetensors").read_bytes() == b"weights"
