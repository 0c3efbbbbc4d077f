"""LoRA's frozen base layers in bf16 (``train.frozen_precision: bf16``): the products they compute, what
stays float32, and a run that trains with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from pydantic import ValidationError

from rayft.config.train import TrainConfig
from rayft.training.modeling.frozen_bf16 import FrozenBf16Linear, bf16_frozen_layers

# Two computations of one quantity compared within a bound: run under every CPU kernel path by
# scripts/test_kernels.py (`make test-kernels`).
pytestmark = pytest.mark.numerics

BF16 = torch.bfloat16


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(64, 48, bias=True)
        self.down_proj = torch.nn.Linear(48, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.silu(self.q_proj(x)))


def _adapted() -> torch.nn.Module:
    torch.manual_seed(0)
    net = get_peft_model(_Block(), PeftLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    for name, param in net.named_parameters():
        if "lora_B" in name:  # a trained adapter, so that its path carries a gradient of its own
            torch.nn.init.normal_(param, std=0.1)
    return net


def _assert_within_bf16_product_bound(
    got: torch.Tensor, a: torch.Tensor, b: torch.Tensor, added: torch.Tensor | None = None
) -> None:
    """``got`` (a product ``a @ b`` whose operands were rounded to bf16, summed in float32 and rounded to bf16)
    within the product's rounding error bound of the exact float64 ``a @ b``.

    Each operand rounds to within a relative u = 2**-9 (bf16 keeps 8 bits), so each term of the sum to within
    2u + u**2; summing n terms in float32 adds at most n * 2**-24 of the sum of the terms' magnitudes; the
    result rounds to bf16 within u of itself, and a bias ``added`` in float32 rounds once more, within 2**-24 of
    the sum. So |got - exact| <= (2u + u**2 + n * 2**-24) * (|a| @ |b|) + u * |got| (+ 2**-24 * |got + bias|),
    element by element, on any kernel that sums in float32, in whatever order (the bound holds for each)."""
    u, n = 2.0**-9, a.shape[-1]
    bias = torch.zeros(()) if added is None else added
    got = got.detach().double()
    product = got - bias.double()
    bound = (2 * u + u**2 + n * 2.0**-24) * (a.abs() @ b.abs()) + u * product.abs() + 2.0**-24 * got.abs()
    error = (product - a @ b).abs()
    assert bool((error <= bound).all()), float((error / bound).max())
    assert bool((error > 0).any())  # bf16's rounding did happen: the bound is not vacuously met by float32


def test_the_layer_computes_the_bf16_product_and_its_input_gradient_and_keeps_the_bias() -> None:
    torch.manual_seed(1)
    plain = torch.nn.Linear(64, 48, bias=True).requires_grad_(False)
    layer = FrozenBf16Linear(plain)
    assert layer.weight.dtype == BF16 and not layer.weight.requires_grad
    assert layer.bias is plain.bias
    x = torch.randn(5, 7, 64, requires_grad=True)
    out = layer(x)
    assert out.dtype == torch.float32
    expected = torch.nn.functional.linear(x.detach().to(BF16), plain.weight.to(BF16)).float() + plain.bias
    # Exact: the layer runs these very operations (functional.linear in bf16, then the bias in float32).
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    grad = torch.randn_like(out)
    out.backward(grad)
    assert x.grad is not None
    torch.testing.assert_close(x.grad, (grad.to(BF16) @ plain.weight.to(BF16)).float(), rtol=0, atol=0)
    # Against float64: bf16's rounding, no more, element by element.
    weight = plain.weight.double()
    _assert_within_bf16_product_bound(out, x.detach().double(), weight.T, added=plain.bias)
    _assert_within_bf16_product_bound(x.grad, grad.double(), weight)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)


def test_only_the_frozen_base_layers_change_and_the_adapter_trains_in_float32() -> None:
    reference, net = _adapted(), _adapted()
    assert bf16_frozen_layers(net) == 2
    assert bf16_frozen_layers(net) == 0  # already done: nothing float32 is left to change
    names = {n: p.dtype for n, p in net.named_parameters()}
    assert set(names) == {n for n, _ in reference.named_parameters()}  # state dict keys unchanged
    assert names["base_model.model.q_proj.base_layer.weight"] == BF16
    assert names["base_model.model.q_proj.base_layer.bias"] == torch.float32
    assert {dtype for name, dtype in names.items() if "lora_" in name} == {torch.float32}
    x = torch.randn(3, 10, 64)
    losses = []
    for model in (reference, net):
        loss = model(x).pow(2).mean()
        loss.backward()
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=0.02)
    trained = {n: p for n, p in net.named_parameters() if p.requires_grad}
    assert trained and all(p.grad is not None and p.grad.dtype == torch.float32 for p in trained.values())
    for name, param in reference.named_parameters():
        if param.requires_grad:
            other = trained[name].grad
            assert other is not None and param.grad is not None
            cosine = torch.nn.functional.cosine_similarity(param.grad.flatten(), other.flatten(), dim=0)
            assert cosine > 0.999, name
    assert all(p.grad is None for n, p in net.named_parameters() if not p.requires_grad)


def test_a_quantized_or_trained_base_layer_is_left_alone() -> None:
    net = _adapted()
    base = net.base_model.model.q_proj.base_layer
    base.weight.requires_grad_(True)
    assert bf16_frozen_layers(net) == 1
    assert net.base_model.model.q_proj.base_layer is base


def test_the_config_refuses_bf16_frozen_layers_without_lora_or_with_a_sharded_strategy() -> None:
    with pytest.raises(ValidationError, match="only a LoRA run has frozen base layers"):
        TrainConfig(method="full", frozen_precision="bf16")
    with pytest.raises(ValidationError, match="set train.strategy=ddp or train.frozen_precision=auto"):
        TrainConfig(strategy="fsdp", frozen_precision="bf16")
    assert TrainConfig(strategy="fsdp").frozen_precision == "auto"


def test_a_run_trains_with_bf16_frozen_layers_close_to_float32(tiny_model_dir: Path, tmp_path: Path) -> None:
    import rayft
    from rayft.config import load_config

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"add {i} and {i}", "completion": f" {2 * i}"}) + "\n"
                            for i in range(16)))  # fmt: skip
    losses = {}
    for frozen in ("fp32", "bf16"):
        cfg = load_config(None, [
            f"model.name={tiny_model_dir}", f"storage_path={tmp_path}", f"name=run-{frozen}", "scaling.num_workers=0",
            f"data.datasets=[{{path: '{data}', format: prompt_completion}}]", "data.validation_fraction=0",
            f"data.cache_dir={tmp_path / 'cache'}", "train.num_epochs=1", "train.micro_batch_size=4",
            "train.eval_steps=null", "train.logging_steps=1", "logging.tensorboard=false",
            f"train.frozen_precision={frozen}", "lora.dropout=0",
        ])  # fmt: skip
        run = rayft.api.train(cfg)
        records = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[frozen] = [r["train/loss"] for r in records if "train/loss" in r]
    assert len(losses["bf16"]) == len(losses["fp32"]) == 4
    assert losses["bf16"] != losses["fp32"]  # the products did change
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.01)


def test_grpos_cpu_generation_actors_build_their_frozen_layers_as_the_trainer_decided(tiny_model_dir: Path) -> None:
    # The weight updates carry only the adapter: an actor whose frozen layers kept fp32 would sample from
    # other probabilities than the trainer's model, which computes the ratios.
    from rayft.config.model import LoraConfig, ModelConfig
    from rayft.config.train import CheckpointConfig, LoggingConfig
    from rayft.runs.location import RunLocation
    from rayft.training.loop.plan import Schedule
    from rayft.training.loop.worker_plan import WorkerPlan
    from rayft.training.methods.rl.rollout_actors import HfRolloutActor
    from rayft.training.methods.rl.setup import actor_spec

    def actor_layers(frozen: str) -> list[torch.nn.Module]:
        plan = WorkerPlan(
            model=ModelConfig(name=str(tiny_model_dir)), lora=LoraConfig(),
            train=TrainConfig(objective="grpo", frozen_precision=frozen), logging=LoggingConfig(),
            checkpoint=CheckpointConfig(), seed=0, location=RunLocation(Path("/tmp/x")), resolved_config="",
            schedule=Schedule(1, 1, 1, 1, 0), shuffle_window=1, has_validation=False,
        )  # fmt: skip
        model = HfRolloutActor(actor_spec(plan)).model
        return [m for m in model.modules() if isinstance(m, FrozenBf16Linear)]

    assert actor_layers("fp32") == []
    layers = actor_layers("bf16")
    assert layers and all(layer.weight.dtype == BF16 for layer in layers)
