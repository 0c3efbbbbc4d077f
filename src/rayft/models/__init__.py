"""Finding, converting and loading models and tokenizers."""

from rayft.models.resolve import ModelSource, resolve_model_source

__all__ = ["ModelSource", "resolve_model_source"]
