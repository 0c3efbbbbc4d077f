"""scripts/test_kernels.py: each variant's settings really change the kernels PyTorch runs, read back from
the libraries themselves (so a variant that silently did nothing cannot pass for a check)."""

from __future__ import annotations

import importlib.util
import platform
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test_kernels.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("test_kernels_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the variants are x86's")
def test_the_variants_settings_change_the_kernels_pytorch_runs() -> None:
    import torch

    script = _script()
    native = script.probe({})
    assert native[0] in ("AVX2", "AVX512")
    # All three libraries' settings at once (one interpreter to start): each is read back from its library.
    capped = script.probe({"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert capped[0] == "DEFAULT"  # ATen's own kernels, as torch reports them
    if torch.backends.mkl.is_available():  # MKL runs float32 products; its compatible branch is named back
        assert native[1] != "COMPATIBLE" and capped[1] == "COMPATIBLE"
    if torch.backends.mkldnn.is_available():  # capped at AVX2, oneDNN leaves bf16 products to PyTorch
        assert capped[2] == "pytorch's own"
    names = [name for name, _ in script.VARIANTS]
    assert names[0] == "native" and len(set(names)) == len(names)
