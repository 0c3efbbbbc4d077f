"""Text generation behind one protocol: Hugging Face generate, and other backends."""

from rayft.generation.backend import (
    Generation,
    GenerationBackend,
    Prompt,
    SamplingParams,
    truncate_at_stop,
)

__all__ = ["Generation", "GenerationBackend", "Prompt", "SamplingParams", "truncate_at_stop"]
