"""``graphflow calibrate``: a backend it cannot probe is refused before the model loads."""

import pytest

from graphflow.bench import calibration


def test_a_backend_it_cannot_probe_is_refused_before_the_model_loads(monkeypatch, tmp_path):
    monkeypatch.setattr(calibration.Engine, "load", lambda *_a, **_k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match="cannot probe backend 'ray' here; use ucx, mpi, local"):
        calibration.calibrate("tiny-llama", ["local", "ray"], tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()
