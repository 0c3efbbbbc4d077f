"""The GPU tier: rayft's training step on CUDA against references (run by ``make gpu-check``).

bf16 LoRA and full steps against an fp32 reference, packed == one-by-one loss with every attention
kernel this machine has, the chunked (and Liger) loss equal to the plain one, and the memory
estimate within 20% of the measured peak. No Ray: these import only torch, transformers and peft.
``RAYFT_GPU_TIER_DEVICE=cpu`` runs the tests that do not measure GPU memory on the CPU (bf16
autocast included), to check the tier itself where no GPU is lent.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest

from rayft.data.collate import collate
from rayft.data.packing import build_units
from rayft.data.prepared import IGNORE_INDEX

pytestmark = pytest.mark.gpu

ARCH = "qwen2-tiny"


@pytest.fixture(scope="module")
def device(device: str) -> Any:
    """The tier's device (tests/gpu/conftest.py) as a torch.device."""
    import torch

    return torch.device(device)


def _examples(vocab: int, count: int = 12, seed: int = 0) -> list[dict[str, Any]]:
    import random

    rng = random.Random(seed)
    out = []
    for index in range(count):
        length = rng.randint(20, 90)
        prompt = rng.randint(5, length - 5)
        ids = [rng.randrange(10, vocab) for _ in range(length)]
        out.append({"input_ids": ids, "labels": [IGNORE_INDEX] * prompt + ids[prompt:],
                    "position_ids": list(range(length)), "sample_ids": [index], "sample_id": index})  # fmt: skip
    return out


def _model(device: Any, dtype: Any, attn: str = "sdpa", method: str = "full") -> Any:
    from rayft.config.model import LoraConfig
    from rayft.testing.architectures import random_model
    from rayft.training.modeling.model import prepare_training_model

    net = random_model(ARCH, dtype=dtype, device=device, attn_implementation=attn)
    # Attention exactly as configured (no CPU per-example switch): prepare for a "cuda" worker.
    net = prepare_training_model(net, LoraConfig(dropout=0.0), method, attn, "cuda",  # type: ignore[arg-type]
                                 gradient_checkpointing=False, compile_blocks=False)  # fmt: skip
    if method == "lora":  # adapters start at zero: give them weights, so that they change the loss
        import torch

        torch.manual_seed(1)
        for name, param in net.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.02)
    return net.to(device)


def _loss_and_grads(model: Any, batches: list[Any], precision: Any, **options: Any) -> tuple[float, list[Any]]:
    from rayft.training.loop.steps import token_loss_sum

    model.zero_grad(set_to_none=True)
    total = sum(b.num_label_tokens for b in batches)
    loss = sum(token_loss_sum(model, b, precision, **options) for b in batches) / total
    loss.backward()
    grads = [p.grad.float().clone() for p in model.parameters() if p.requires_grad]
    return float(loss.detach()), grads


def _cosine(a: Any, b: Any) -> float:
    import torch

    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


@pytest.mark.parametrize("method", ["full", "lora"])
def test_bf16_step_matches_the_fp32_reference(device: Any, method: str) -> None:
    import torch

    from rayft.config.model import ModelConfig
    from rayft.models.loading import resolve_dtype
    from rayft.training.loop.steps import step_options
    from rayft.training.modeling.model import training_dtype
    from rayft.training.modeling.precision import Precision

    batch = collate(build_units(_examples(4096), [list(range(6)), list(range(6, 12))]), pad_token_id=0).to(device)
    options = step_options("sdpa", "auto", "cuda" if device.type == "cuda" else "cpu")
    reference = _model(device, torch.float32, method=method)
    ref_loss, ref_grads = _loss_and_grads(reference, [batch], Precision(None, False), **options)
    dtype = resolve_dtype(training_dtype(ModelConfig(), method, "cuda"), device.type)  # type: ignore[arg-type]
    dtype = torch.bfloat16 if method == "lora" else dtype
    mixed = _model(device, dtype, method=method)
    loss, grads = _loss_and_grads(mixed, [batch], Precision(torch.bfloat16, False), **options)
    assert loss == pytest.approx(ref_loss, rel=2e-2)
    assert len(grads) == len(ref_grads)
    for got, want in zip(grads, ref_grads, strict=True):
        assert _cosine(got, want) > 0.99


def _attentions() -> list[str]:
    kernels = ["sdpa", "eager", "sdpa_per_example"]
    if importlib.util.find_spec("flash_attn") is not None:
        kernels.append("flash_attention_2")
    if importlib.util.find_spec("flash_attn_interface") is not None:
        kernels.append("flash_attention_3")
    if importlib.util.find_spec("kernels") is not None and os.environ.get("RAYFT_HUB_KERNEL"):
        kernels.append(os.environ["RAYFT_HUB_KERNEL"])  # a Hub kernel already in the local cache
    return kernels


@pytest.mark.parametrize("attn", [*_attentions(), "flex_attention"])
def test_packed_loss_equals_one_by_one_with_every_attention(device: Any, attn: str) -> None:
    import torch

    from rayft.training.modeling import attention
    from rayft.training.modeling.attention import row_multiple, uses_varlen
    from rayft.training.modeling.precision import Precision

    if attn == "flex_attention" and device.type != "cuda":
        pytest.skip("flex_attention has no backward on the CPU")
    attention.register()
    flash = attn.startswith("flash") or "/" in attn
    dtype = torch.bfloat16 if flash else torch.float32
    precision = Precision(torch.bfloat16 if flash else None, False)
    model = _model(device, dtype, attn=attn)
    examples = _examples(4096)
    # Rows padded as training pads them for this kernel (flex_attention: whole 128-token blocks).
    multiple = row_multiple(attn)
    packed = collate(build_units(examples, [list(range(6)), list(range(6, 12))]), pad_token_id=0,
                     pad_to_multiple_of=max(64, multiple)).to(device)  # fmt: skip
    singles = [collate([e], pad_token_id=0, pad_to_multiple_of=multiple).to(device) for e in examples]
    varlen = uses_varlen(attn)
    packed_loss, packed_grads = _loss_and_grads(model, [packed], precision, varlen=varlen)
    single_loss, single_grads = _loss_and_grads(model, singles, precision, varlen=varlen)
    assert packed_loss == pytest.approx(single_loss, rel=1e-2 if flash else 1e-5)
    for a, b in zip(packed_grads, single_grads, strict=True):
        assert _cosine(a, b) > (0.99 if flash else 0.99999)


@pytest.mark.parametrize("kind", ["chunked", "liger"])
@pytest.mark.parametrize("method", ["full", "lora"])
def test_fused_losses_equal_the_plain_loss(device: Any, kind: str, method: str) -> None:
    import torch

    from rayft.training.modeling.loss import liger_installed
    from rayft.training.modeling.precision import Precision

    if kind == "liger" and (device.type != "cuda" or not liger_installed()):
        pytest.skip("Liger needs CUDA and liger-kernel (pip install 'rayft[liger]')")
    batch = collate(build_units(_examples(4096), [list(range(12))]), pad_token_id=0).to(device)
    model = _model(device, torch.float32, method=method)
    for precision, rel, cos in (
        (Precision(None, False), 1e-5, 0.99999),
        (Precision(torch.bfloat16, False), 1e-2, 0.99),
    ):
        plain_loss, plain_grads = _loss_and_grads(model, [batch], precision, loss="none")
        fused_loss, fused_grads = _loss_and_grads(model, [batch], precision, loss=kind)
        assert fused_loss == pytest.approx(plain_loss, rel=rel)
        for a, b in zip(fused_grads, plain_grads, strict=True):
            assert _cosine(a, b) > cos


@pytest.mark.parametrize("method", ["full", "lora"])
def test_memory_estimate_is_within_20_percent_of_the_measured_peak(device: Any, method: str) -> None:
    import torch

    from rayft.config.model import LoraConfig, ModelConfig
    from rayft.config.train import TrainConfig
    from rayft.models.loading import resolve_dtype
    from rayft.testing.architectures import random_model
    from rayft.training.loop.steps import step_options, train_step
    from rayft.training.loop.worker import build_optimizer
    from rayft.training.modeling.model import count_parameters, prepare_training_model, training_dtype
    from rayft.training.modeling.precision import resolve_precision
    from rayft.training.strategies.memory import estimate_worker_memory
    from rayft.training.strategies.table import parallelism

    if device.type != "cuda":
        pytest.skip("measures CUDA memory")
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    dtype = resolve_dtype(training_dtype(ModelConfig(), method, "cuda"), "cuda")  # type: ignore[arg-type]
    net = random_model("qwen2.5-1.5b", dtype=dtype, device=device)  # its state dwarfs a small batch's activations
    net = prepare_training_model(net, LoraConfig(), method, "sdpa", "cuda",  # type: ignore[arg-type]
                                 gradient_checkpointing=False, compile_blocks=False)  # fmt: skip
    trainable, total = count_parameters(net)
    weight_bytes = next(net.parameters()).element_size()
    estimate = estimate_worker_memory(
        total_params=total, trainable_params=trainable, weight_bytes=weight_bytes, sharded=False, world_size=1
    )
    optimizer = build_optimizer(net, TrainConfig())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    # A small batch: the model's state, not activations, is what the estimate covers.
    batch = collate(build_units(_examples(151936, count=2), [[0, 1]]), pad_token_id=0).to(device)
    for _ in range(2):
        train_step(net, optimizer, scheduler, [batch], parallel=parallelism("ddp", 1),
                   precision=resolve_precision("auto", "cuda"), scaler=None, max_grad_norm=1.0, world_size=1,
                   device=device, **step_options("sdpa", "auto", "cuda"))  # fmt: skip
    peak = torch.cuda.max_memory_allocated(device) - base
    assert estimate.total == pytest.approx(peak, rel=0.2), (estimate.describe(), peak / 2**30)
