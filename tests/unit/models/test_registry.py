from __future__ import annotations

import pytest

from graphflow.models import MODELS, ModelSpec, known_models, resolve


def test_registry_names():
    assert known_models() == ["qwen2-0.5b-shape", "smollm2-135m", "smollm2-shape", "tiny-llama", "tiny-qwen2"]
    assert resolve("tiny-llama") is MODELS["tiny-llama"]


def test_unknown_name_lists_known_models():
    with pytest.raises(ValueError) as info:
        resolve("gpt-17")
    message = str(info.value)
    assert "unknown model 'gpt-17'" in message
    assert all(name in message for name in known_models())
    assert "\n" not in message


def test_local_checkpoint_folder_resolves(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    spec = resolve(str(tmp_path))
    assert spec.source == "folder" and spec.path == str(tmp_path.resolve())


def test_spec_validation():
    with pytest.raises(ValueError, match="arch"):
        ModelSpec("x", "random", "bad", arch="gpt2")
    with pytest.raises(ValueError, match="dtype"):
        ModelSpec("x", "random", "bad", arch="llama", dtype="int4")
