"""GraphFlow: distributed serving of LLM-agent workflows with the KV cache as a first-class object."""

__version__ = "0.1.0"
__all__ = ["__version__"]
