"""The GPU tier: the optional kernels against the plain path, in loss and gradients (run by ``make gpu-check``).

Liger's RMSNorm, SwiGLU and RoPE (``train.liger_kernels``), each patched alone and all together, against the
same model without them; flash-attn's variable-length attention over packed rows against plain SDPA over
the examples one by one; and the step's planner on this GPU picking an attention kernel that trains. Each
case skips where its package is not installed (``pip install 'rayft[liger]'``, ``pip install flash-attn``).
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from rayft.data.collate import collate
from rayft.data.packing import build_units
from tests.gpu.test_gpu_step import _cosine, _examples, _loss_and_grads, _model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda(device: str) -> Any:
    """The CUDA device: these kernels do not run on the CPU."""
    import torch

    if device != "cuda":
        pytest.skip("Liger and flash-attn kernels need a CUDA GPU")
    return torch.device("cuda")


@pytest.fixture
def restored_rope() -> Iterator[None]:
    """Liger patches the rotary embedding into the modelling module, for every model of the process: undo it."""
    from transformers.models.qwen2 import modeling_qwen2

    original = modeling_qwen2.apply_rotary_pos_emb
    yield
    modeling_qwen2.apply_rotary_pos_emb = original


@pytest.mark.parametrize("parts", [{"rms_norm"}, {"swiglu"}, {"rope"}, {"rms_norm", "swiglu", "rope"}],
                         ids=["rms_norm", "swiglu", "rope", "all"])  # fmt: skip
@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.usefixtures("restored_rope")
def test_liger_kernels_equal_the_plain_modules(cuda: Any, parts: set[str], method: str) -> None:
    import torch

    from rayft.training.modeling.precision import Precision

    if importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("needs liger-kernel (pip install 'rayft[liger]')")
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    batch = collate(build_units(_examples(4096), [list(range(12))]), pad_token_id=0).to(cuda)
    plain = _model(cuda, torch.float32, method=method)
    patched = copy.deepcopy(plain)
    base = patched.get_base_model() if hasattr(patched, "get_base_model") else patched
    flags = {name: name in parts for name in ("rope", "rms_norm", "swiglu")}
    _apply_liger_kernel_to_instance(model=base, cross_entropy=False, fused_linear_cross_entropy=False, **flags)
    for precision, rel, cos in ((Precision(None, False), 1e-4, 0.9999), (Precision(torch.bfloat16, False), 2e-2, 0.99)):
        plain_loss, plain_grads = _loss_and_grads(plain, [batch], precision, loss="none")
        liger_loss, liger_grads = _loss_and_grads(patched, [batch], precision, loss="none")
        assert liger_loss == pytest.approx(plain_loss, rel=rel)
        assert len(liger_grads) == len(plain_grads)
        for a, b in zip(liger_grads, plain_grads, strict=True):
            assert _cosine(a, b) > cos


@pytest.mark.usefixtures("restored_rope")
def test_train_liger_kernels_builds_a_model_that_trains_as_the_plain_one(cuda: Any) -> None:
    """prepare_training_model(liger_kernels=True): the same loss as without, with Liger's forward bound in."""
    import torch

    from rayft.config.model import LoraConfig
    from rayft.testing.architectures import random_model
    from rayft.training.modeling.model import prepare_training_model
    from rayft.training.modeling.precision import Precision

    if importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("needs liger-kernel (pip install 'rayft[liger]')")
    batch = collate(build_units(_examples(4096), [list(range(12))]), pad_token_id=0).to(cuda)
    losses = []
    for liger in (False, True):
        net = random_model("qwen2-tiny", dtype=torch.float32, device=cuda)
        net = prepare_training_model(
            net, LoraConfig(dropout=0.0), "full", "sdpa", "cuda", gradient_checkpointing=False,
            compile_blocks=False, liger_kernels=liger,
        )  # fmt: skip
        if liger:  # Liger binds its RMSNorm's forward into each norm module
            assert vars(net.model.norm)["forward"].__func__.__qualname__.startswith("LigerRMSNorm")
        losses.append(_loss_and_grads(net.to(cuda), [batch], Precision(None, False), loss="none")[0])
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)


def test_flash_attention_varlen_on_packed_rows_equals_sdpa_one_by_one(cuda: Any) -> None:
    import torch

    from rayft.training.modeling.precision import Precision

    if importlib.util.find_spec("flash_attn") is None:
        pytest.skip("needs flash-attn (pip install flash-attn)")
    precision = Precision(torch.bfloat16, False)
    examples = _examples(4096)
    packed = collate(build_units(examples, [list(range(6)), list(range(6, 12))]), pad_token_id=0).to(cuda)
    singles = [collate([e], pad_token_id=0).to(cuda) for e in examples]
    flash = _model(cuda, torch.bfloat16, attn="flash_attention_2")
    sdpa = _model(cuda, torch.bfloat16, attn="sdpa")
    flash_loss, flash_grads = _loss_and_grads(flash, [packed], precision, varlen=True)
    sdpa_loss, sdpa_grads = _loss_and_grads(sdpa, singles, precision)
    assert flash_loss == pytest.approx(sdpa_loss, rel=1e-2)
    for a, b in zip(flash_grads, sdpa_grads, strict=True):
        assert _cosine(a, b) > 0.99


def test_the_planners_gpu_attention_trains_packed_rows(cuda: Any) -> None:
    """What ``auto`` picks on this GPU (flash_attention_2 or flex_attention for packed rows) gives the
    loss of SDPA over the examples one by one."""
    import torch

    from rayft.training.modeling.attention import row_multiple, uses_varlen
    from rayft.training.modeling.precision import Precision
    from rayft.training.modeling.step_choice import StepRequest, choose_step
    from rayft.training.modeling.step_facts import gather_step_facts

    facts = gather_step_facts("cuda", method="full", hidden_size=256, num_layers=2, vocab_size=4096, seq_length=512,
                              micro_batch_size=2, packing=True, cpus=1)  # fmt: skip
    attention = choose_step(StepRequest(), facts).attention
    assert attention in ("flash_attention_2", "flex_attention")
    precision = Precision(torch.bfloat16, False)
    examples = _examples(4096)
    multiple = row_multiple(attention)
    packed = collate(build_units(examples, [list(range(6)), list(range(6, 12))]), pad_token_id=0,
                     pad_to_multiple_of=max(64, multiple)).to(cuda)  # fmt: skip
    singles = [collate([e], pad_token_id=0).to(cuda) for e in examples]
    chosen_loss, _ = _loss_and_grads(_model(cuda, torch.float32, attn=attention), [packed], precision,
                                     varlen=uses_varlen(attention))  # fmt: skip
    sdpa_loss, _ = _loss_and_grads(_model(cuda, torch.float32, attn="sdpa"), singles, precision)
    assert chosen_loss == pytest.approx(sdpa_loss, rel=1e-2)
