"""The gpu tier's device: CUDA, or the CPU when ``RAYFT_GPU_TIER_DEVICE=cpu`` asks for it (to check
the tier itself where no GPU is lent); without a GPU the tier skips."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def device() -> str:
    """'cuda' or 'cpu', as the tier is asked to run."""
    import torch

    wanted = os.environ.get("RAYFT_GPU_TIER_DEVICE", "cuda")
    if wanted == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (RAYFT_GPU_TIER_DEVICE=cpu checks the tier on the CPU)")
    return wanted
