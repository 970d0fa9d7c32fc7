from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")


@pytest.fixture(scope="session")
def tiny_engine():
    from graphflow.models import Engine

    return Engine.load("tiny-llama")


@pytest.fixture(scope="session")
def tiny_qwen_engine():
    from graphflow.models import Engine

    return Engine.load("tiny-qwen2")
