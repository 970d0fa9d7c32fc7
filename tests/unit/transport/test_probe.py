from __future__ import annotations

import json

import pytest

from graphflow.bench.calibration import calibrate
from scheduler.calibrate import load_profile
from transport.probe import probe_blocks


def test_probe_blocks_sizes():
    headers, tensors = probe_blocks(10_000, 4096)
    assert len(headers) == 2 and all(h.nbytes == 4096 for h in headers)
    with pytest.raises(ValueError, match="positive"):
        probe_blocks(0, 4096)


def test_calibrate_writes_a_usable_profile(tmp_path):
    prof = calibrate("tiny-llama", ["local"], tmp_path / "p.json", repeats=1)
    back = load_profile(tmp_path / "p.json", "tiny-llama", prof.config_hash)
    assert back == prof
    assert back.link("local").bandwidth_bytes_per_s > 0
    assert back.prefill(4096) > back.prefill(96) > 0
    assert back.reconstruct is not None and back.reconstruct(1 << 20) > 0
    assert json.loads((tmp_path / "p.json").read_text())["kv_bytes_per_token"] == 512
    with pytest.raises(ValueError, match="cannot probe"):
        calibrate("tiny-llama", ["carrier-pigeon"], tmp_path / "q.json", repeats=1)
