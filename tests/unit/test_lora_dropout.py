"""LoRA's input dropout without a copy of each adapted layer's input: the same numbers as PEFT's own path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from rayft.config.model import LoraConfig, ModelConfig

# The comparisons below are marked `numerics`: scripts/test_kernels.py (`make test-kernels`) runs them under
# every CPU kernel path.
NUMERICS = pytest.mark.numerics


def _peft_model(tiny_model_dir: Path, dropout: float, **peft_options: Any) -> Any:
    import torch
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    # init_lora_weights=False: lora_B random too, so that every adapter's gradients are non-zero.
    options = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "init_lora_weights": False} | peft_options
    model = get_peft_model(net, PeftLoraConfig(lora_dropout=dropout, task_type="CAUSAL_LM", **options))
    model.train()
    return model


def _step(model: Any, ids: Any, seed: int = 7) -> tuple[Any, dict[str, Any], int]:
    """(loss, gradients by name, bytes of the distinct storages autograd saved for the backward pass, the
    parameters' own left out: they are held anyway)."""
    import torch

    storages: dict[int, int] = {}
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in parameters:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    torch.manual_seed(seed)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads, sum(storages.values())


def _same_mask_dropout(p: float) -> Any:
    """A module in place of PEFT's ``nn.Dropout``: draws its mask as the lean layer does on CPU, from the
    same generator, and applies it to the input as PEFT's dropout applies its own."""
    import torch

    from rayft.training.modeling.lora_dropout import cpu_keep_mask

    class SameMaskDropout(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            drawn = cpu_keep_mask(x.shape, p)
            assert drawn is not None
            mask, scale = drawn
            return x * mask * scale

    return SameMaskDropout()


def _with_same_masks(model: Any, p: float) -> Any:
    """``model`` with every adapter's ``nn.Dropout`` drawing the CPU's masks (:func:`_same_mask_dropout`)."""
    import torch

    for module in model.modules():
        for name, dropout in getattr(module, "lora_dropout", {}).items():
            if isinstance(dropout, torch.nn.Dropout):
                module.lora_dropout[name] = _same_mask_dropout(p)
    return model


# float32's unit roundoff: a product or a sum rounds to within a relative 2**-24 of its exact value.
_FP32_U = 2.0**-24


def _fp32_errors(reference64: Any, peft: Any, lean: Any, ids: Any, seed: int) -> dict[str, tuple[float, float]]:
    """For the loss and each gradient: (the lean path's relative error, PEFT's relative error), both against
    the float64 copy ``reference64`` of PEFT's path on the same masks."""
    import torch

    (want_loss, want, _), (peft_loss, peft_grads, _), (loss, grads, _) = (
        _step(model, ids, seed) for model in (reference64, peft, lean)
    )

    def error(got: Any, exact: Any) -> float:
        return float((got.double() - exact).norm() / exact.norm())

    assert grads.keys() == want.keys() and all(torch.count_nonzero(g) for g in grads.values())
    errors = {name: (error(grads[name], want[name]), error(peft_grads[name], want[name])) for name in want}
    return errors | {"loss": (error(loss, want_loss), error(peft_loss, want_loss))}


def _inaccurate(errors: dict[str, tuple[float, float]], tokens: int) -> dict[str, tuple[float, float]]:
    """The quantities where the lean path is less accurate than float32 allows.

    The lean path computes what PEFT's does, in float32 too; they differ in where one rounding falls: PEFT
    rounds ``x * scale`` once per input element, the lean path ``weight * scale`` once per weight entry. How
    far a random model carries a rounding is measured by PEFT's own error against float64 (the worst of the
    step's quantities). PEFT's roundings are each token's own and average out over the ``tokens`` summed in
    a weight's gradient; the lean path's are shared by every token and add up: its error can reach
    sqrt(tokens) times PEFT's (the ratio seen on AVX-512, AVX2, the scalar default kernels and MKL's
    compatible branch stayed under 5 with 72 tokens, where sqrt(72) = 8.5). Plus 16 roundings (16 * 2**-24)
    for a quantity whose error is a handful of roundings. A wrong mask or scale errs by its own size (a
    flipped mask element: ~1e-2; a scale off by 2**-12: 2.4e-4), far beyond. (A bound on the difference of
    the two float32 paths alone, as this once was, is a bound on one CPU's kernels: 1e-5 held on an AMD EPYC
    and not on an AMX Xeon.)
    """
    bound = tokens**0.5 * max(peft for _, peft in errors.values()) + 16 * _FP32_U
    return {k: (lean, peft) for k, (lean, peft) in errors.items() if lean > bound}


def _compare_steps(reference: Any, lean: Any, *, exact: bool, checkpointing: bool, autocast: bool) -> None:
    """Two steps of each model on the same ids and seeds; losses and gradients equal (``exact``), or, in
    float32, each as accurate against float64 as PEFT's; under autocast, the same loss to 1%."""
    import torch

    ids = torch.randint(0, reference.config.vocab_size, (3, 24))
    reference64 = copy.deepcopy(reference).double() if not (exact or autocast) else None
    for seed in (7, 8):  # two steps: each draws new masks, the same ones on both paths
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            want_loss, want_grads, want_saved = _step(reference, ids, seed)
            loss, grads, saved = _step(lean, ids, seed)
        assert grads.keys() == want_grads.keys()
        if exact:  # the same operations in the same order: the same bits
            assert torch.equal(loss, want_loss)
            assert all(torch.equal(grad, want_grads[name]) for name, grad in grads.items())
        elif reference64 is not None:
            assert not _inaccurate(_fp32_errors(reference64, reference, lean, ids, seed), ids.numel())
        else:
            # bf16 keeps 8 bits (a rounding is within 2**-9 = 0.2%); the loss of this 2-layer model goes
            # through a few such roundings on each path, each path its own: 1%, five roundings' worth.
            # Gradients under autocast: a random model amplifies each path's own bf16 rounding differently;
            # the layer's accuracy is compared alone (test_under_autocast_the_cpu_s_path_is_as_accurate_as_peft_s).
            torch.testing.assert_close(loss, want_loss, rtol=0.01, atol=0)
        assert all(grad.abs().sum() > 0 for grad in grads.values())
        if not checkpointing and not autocast:
            # PEFT keeps each adapted layer's dropped-out input and its mask; the lean path the mask only.
            assert saved < want_saved
        elif not checkpointing:
            # Under autocast both keep the dropped-out input in bf16 (the frozen layer keeps its own copy).
            assert saved <= want_saved
    # A different seed draws different masks: the dropout is live, not switched off.
    assert not torch.equal(_step(lean, ids, 9)[0], _step(lean, ids, 7)[0])


def _lean_and_reference(tiny_model_dir: Path, checkpointing: bool) -> tuple[Any, Any]:
    from rayft.training.modeling.lora_dropout import DroppedInputLinear, lean_lora_dropout
    from rayft.training.modeling.model import enable_activation_checkpointing

    peft_path = _peft_model(tiny_model_dir, 0.3)
    lean = copy.deepcopy(peft_path)
    adapted = sum(1 for m in peft_path.modules() if type(m).__name__ == "Linear" and hasattr(m, "lora_A"))
    assert lean_lora_dropout(lean) == adapted > 0
    assert sum(isinstance(m, DroppedInputLinear) for m in lean.modules()) == adapted
    assert lean.state_dict().keys() == peft_path.state_dict().keys()
    if checkpointing:
        for model in (peft_path, lean):
            enable_activation_checkpointing(model)
    return peft_path, lean


@NUMERICS
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_with_torch_s_dropout_kernel_the_lean_path_is_peft_s_bit_for_bit(
    tiny_model_dir: Path, checkpointing: bool, autocast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path taken on CUDA (torch's fused dropout draws the mask, as in PEFT), run on CPU."""
    from rayft.training.modeling import lora_dropout

    monkeypatch.setattr(lora_dropout, "cpu_keep_mask", lambda shape, p: None)
    peft_path, lean = _lean_and_reference(tiny_model_dir, checkpointing)
    _compare_steps(peft_path, lean, exact=True, checkpointing=checkpointing, autocast=autocast)


@NUMERICS
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_with_the_cpu_s_mask_the_lean_path_is_peft_s_for_the_same_mask(
    tiny_model_dir: Path, checkpointing: bool, autocast: bool
) -> None:
    """On CPU the mask is :func:`cpu_keep_mask`'s and the scale moves to ``lora_A``'s weight: the same numbers
    as PEFT's path given that mask, to float32's rounding; under bf16 autocast the same loss to 1%, and the
    backward pass runs in the forward's dtypes."""
    peft_path, lean = _lean_and_reference(tiny_model_dir, checkpointing)
    _compare_steps(_with_same_masks(peft_path, 0.3), lean, exact=False, checkpointing=checkpointing, autocast=autocast)


def _flip_first(drawn: Any) -> Any:
    mask, scale = drawn
    mask = mask.clone()
    mask.view(-1)[0] = ~mask.view(-1)[0]
    return mask, scale


@NUMERICS
@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(_flip_first, id="one-mask-element-flipped"),
        pytest.param(lambda drawn: (drawn[0], drawn[1] * (1 + 2.0**-12)), id="scale-off-by-2**-12"),
    ],
)
def test_a_lean_path_with_a_wrong_mask_or_scale_fails_the_comparison(
    tiny_model_dir: Path, broken: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The float32 comparison above can fail: the lean layer given a mask with one element flipped, or a scale
    off by 2**-12, is caught, on the gradients of the adapters that took it."""
    import torch

    from rayft.training.modeling import lora_dropout

    peft_path, lean = _lean_and_reference(tiny_model_dir, checkpointing=False)
    reference = _with_same_masks(peft_path, 0.3)  # its dropouts keep the right draw
    right = lora_dropout.cpu_keep_mask
    monkeypatch.setattr(lora_dropout, "cpu_keep_mask", lambda shape, p: broken(right(shape, p)))
    ids = torch.randint(0, reference.config.vocab_size, (3, 24))
    caught = _inaccurate(_fp32_errors(copy.deepcopy(reference).double(), reference, lean, ids, 7), ids.numel())
    assert any(".lora_A." in name for name in caught), caught


def _one_layer_grads(path: str, draw: int, x: Any, weight: Any, grad_out: Any, *, autocast: bool) -> tuple[Any, ...]:
    """Gradients of x and the weight through one adapter's dropout and ``lora_A``: PEFT's order (``peft``:
    scale the input, then the product) or the lean layer (``lean``), the mask drawn after seeding ``draw``."""
    import torch

    from rayft.training.modeling.lora_dropout import _DroppedInputLinear, cpu_keep_mask

    torch.manual_seed(draw)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if path == "peft":
            drawn = cpu_keep_mask(x.shape, 0.3)
            assert drawn is not None
            out = torch.nn.functional.linear(x * drawn[0] * drawn[1], weight)
        else:
            out = _DroppedInputLinear.apply(x, weight, 0.3)  # type: ignore[no-untyped-call]
    return torch.autograd.grad(out.float(), (x, weight), grad_out)


@NUMERICS
def test_under_autocast_the_cpu_s_path_is_as_accurate_as_peft_s() -> None:
    """One layer in bf16 autocast, PEFT's order against the lean one: each gradient's error against
    float32, averaged over 40 draws."""
    import torch

    torch.manual_seed(0)
    errors: dict[str, list[float]] = {"peft": [], "lean": []}
    for draw in range(40):
        x = torch.randn(3, 24, 64, requires_grad=True)
        weight = torch.randn(16, 64, requires_grad=True)
        grad_out = torch.randn(3, 24, 16)
        exact = _one_layer_grads("peft", draw, x, weight, grad_out, autocast=False)
        for path in errors:
            grads = _one_layer_grads(path, draw, x, weight, grad_out, autocast=True)
            errors[path] += [float((g - e).norm() / e.norm()) for g, e in zip(grads, exact, strict=True)]
    peft_error, lean_error = (sum(v) / len(v) for v in (errors["peft"], errors["lean"]))
    assert 0 < peft_error < 0.01  # bf16's own rounding
    assert lean_error < 1.1 * peft_error, (lean_error, peft_error)


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9])
def test_the_cpu_s_mask_keeps_each_element_with_the_probability_it_scales_by(p: float) -> None:
    import torch

    from rayft.training.modeling.lora_dropout import MASK_BITS, cpu_keep_mask

    torch.manual_seed(0)
    shape = torch.Size([64, 1000, 33])  # an element count not a multiple of four: the last word is cut
    drawn = cpu_keep_mask(shape, p)
    assert drawn is not None
    mask, scale = drawn
    assert mask.shape == shape and mask.dtype == torch.bool
    keep = 1.0 / scale
    assert abs(keep - (1.0 - p)) <= 2.0 ** -(MASK_BITS + 1)  # p as the nearest multiple of 2**-16
    count = mask.numel()
    std = (keep * (1 - keep) / count) ** 0.5
    assert abs(mask.float().mean().item() - keep) < 5 * std
    # Each position is as likely kept as any other: the four 16-bit lanes of a word alike.
    lanes = mask.flatten()[: count // 4 * 4].view(-1, 4).float().mean(0)
    assert torch.all((lanes - keep).abs() < 5 * (keep * (1 - keep) / (count // 4)) ** 0.5)
    # Dropped-out ones average one: the scale is the inverse of the probability used.
    assert abs((mask.double() * scale).mean().item() - 1.0) < 5 * std * scale
    # The same generator state draws the same mask; the next draw another.
    torch.manual_seed(0)
    again = cpu_keep_mask(shape, p)
    assert again is not None and torch.equal(again[0], mask)
    later = cpu_keep_mask(shape, p)
    assert later is not None and not torch.equal(later[0], mask)


@pytest.mark.parametrize("p", [1e-6, 1 - 1e-6])
def test_a_probability_that_16_bits_cannot_hold_takes_torch_s_dropout(p: float, tiny_model_dir: Path) -> None:
    import torch

    from rayft.training.modeling.lora_dropout import _DroppedInputLinear, cpu_keep_mask

    assert cpu_keep_mask(torch.Size([8, 4]), p) is None
    x = torch.randn(3, 8, requires_grad=True)
    weight = torch.randn(2, 8, requires_grad=True)
    torch.manual_seed(3)
    out = _DroppedInputLinear.apply(x, weight, p)  # type: ignore[no-untyped-call]
    torch.manual_seed(3)
    dropped, _ = torch.native_dropout(x, p, True)
    assert torch.equal(out, torch.nn.functional.linear(dropped, weight))


@NUMERICS
def test_in_evaluation_the_lean_layer_is_lora_a_without_dropout(tiny_model_dir: Path) -> None:
    import torch

    from rayft.training.modeling.lora_dropout import lean_lora_dropout

    peft_path = _peft_model(tiny_model_dir, 0.3)
    lean = copy.deepcopy(peft_path)
    lean_lora_dropout(lean)
    ids = torch.randint(0, peft_path.config.vocab_size, (2, 16))
    peft_path.eval()
    lean.eval()
    with torch.no_grad():
        assert torch.equal(lean(input_ids=ids).logits, peft_path(input_ids=ids).logits)
        assert torch.equal(lean(input_ids=ids).logits, lean(input_ids=ids).logits)


@NUMERICS
def test_the_saved_adapter_is_peft_s_and_loads_back(tiny_model_dir: Path, tmp_path: Path) -> None:
    import json

    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rayft.training.modeling.lora_dropout import lean_lora_dropout

    peft_path = _peft_model(tiny_model_dir, 0.3)
    lean = copy.deepcopy(peft_path)
    lean_lora_dropout(lean)
    peft_path.save_pretrained(tmp_path / "peft")
    lean.save_pretrained(tmp_path / "lean")
    want = load_file(tmp_path / "peft/adapter_model.safetensors")
    got = load_file(tmp_path / "lean/adapter_model.safetensors")
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert json.loads((tmp_path / "lean/adapter_config.json").read_text())["lora_dropout"] == 0.3
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "lean"))
    ids = torch.randint(0, peft_path.config.vocab_size, (2, 16))
    peft_path.eval()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, peft_path(input_ids=ids).logits)


@pytest.mark.parametrize(("dropout", "options"), [(0.0, {}), (0.3, {"use_dora": True})])
def test_adapters_without_dropout_or_with_a_variant_keep_peft_s_path(
    tiny_model_dir: Path, dropout: float, options: dict[str, Any]
) -> None:
    from rayft.training.modeling.lora_dropout import lean_lora_dropout

    model = _peft_model(tiny_model_dir, dropout, **options)
    assert lean_lora_dropout(model) == 0


def test_the_worker_s_build_takes_the_lean_dropout(tiny_model_dir: Path) -> None:
    from rayft.training.modeling.lora_dropout import DroppedInputLinear
    from rayft.training.modeling.model import build_training_model

    def build(dropout: float) -> Any:
        return build_training_model(
            ModelConfig(name=str(tiny_model_dir)), LoraConfig(dropout=dropout), "lora", "cpu",
            gradient_checkpointing=False, restore_dir=None,
        )  # fmt: skip

    assert any(isinstance(m, DroppedInputLinear) for m in build(0.05).modules())
    assert not any(isinstance(m, DroppedInputLinear) for m in build(0.0).modules())


def test_a_lora_run_with_dropout_trains_under_bf16_autocast(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The whole loop (in-process) with ``train.mixed_precision=bf16`` on CPU: the lean layer's backward runs
    under the forward's autocast, where it once multiplied a bf16 gradient by a float32 weight."""
    import json
    import math

    import rayft
    from rayft.config import load_config

    cfg = load_config(None, [
        f"model.name={tiny_model_dir}", f"storage_path={tmp_path}", "name=run", "scaling.num_workers=0",
        "data.datasets=[{path: 'builtin:arithmetic', max_rows: 16}]", "data.validation_fraction=0",
        "train.micro_batch_size=2", "train.max_steps=2", "train.logging_steps=1", "train.eval_steps=null",
        "train.mixed_precision=bf16", "lora.r=4", "lora.dropout=0.1", "logging.tensorboard=false",
    ])  # fmt: skip
    run = rayft.api.train(cfg)
    losses = [json.loads(line).get("train/loss") for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert run.steps == 2
    assert [loss for loss in losses if loss is not None] and all(math.isfinite(x) for x in losses if x is not None)
