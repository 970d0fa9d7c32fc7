"""Model registry and engine adapter over Hugging Face transformers."""

from graphflow.models.engine import DecodeResult, Engine, PrefillResult, clone_cache
from graphflow.models.loading import LoadedModel, load_model
from graphflow.models.prompts import prompt_token_ids
from graphflow.models.registry import MODELS, ModelSpec, known_models, resolve

__all__ = [
    "MODELS",
    "DecodeResult",
    "Engine",
    "LoadedModel",
    "ModelSpec",
    "PrefillResult",
    "clone_cache",
    "known_models",
    "load_model",
    "prompt_token_ids",
    "resolve",
]
