"""Helpers shared by rayft's tests and by users testing their own setups: tiny models, fakes."""

from rayft.testing.tiny import build_tiny_bart, build_tiny_model, build_tiny_t5, build_tiny_tokenizer

__all__ = ["build_tiny_bart", "build_tiny_model", "build_tiny_t5", "build_tiny_tokenizer"]
