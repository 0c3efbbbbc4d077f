"""The LoRA variants (DoRA, rsLoRA, PiSSA and OLoRA initialisation) trained by short in-process runs of the
tiny model, then exported merged: the merged weights against their formula computed here in float64, and
the exported model against base + adapter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayft.config import load_config
from rayft.data.prepared import PreparedData
from tests.support.runs import tiny_config, train_on

pytestmark = pytest.mark.integration

PROMPTS = ["What is 3 + 4?", "Maya buys 2 boxes of 5 pencils."]
U32 = 2.0**-24  # float32's unit roundoff: storing a value in float32 moves it by at most U32 of itself
VARIANTS = {
    "dora": ("lora.use_dora=true",),
    "rslora": ("lora.use_rslora=true", "lora.alpha=8"),
    "pissa": ("lora.init=pissa",),
    "olora": ("lora.init=olora",),
}


@pytest.fixture(scope="module")
def prepared(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    from transformers import AutoTokenizer

    from rayft.testing.units import arithmetic_prepared

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return arithmetic_prepared(tmp_path_factory.mktemp("units"), tokenizer, num_train=16)


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant_run(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    prepared: PreparedData,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, Path]:
    storage = tmp_path_factory.mktemp(f"{request.param}-runs")
    cfg = tiny_config(tiny_model_dir, storage, "scaling.num_workers=0", "train.max_steps=4", *VARIANTS[request.param])
    return request.param, train_on(cfg, prepared)


def _logits(model: Any, tokenizer: Any) -> Any:
    import torch

    tokenizer.padding_side = "left"
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model(**batch).logits
    return out[batch["attention_mask"].bool()]


def _expected_merge(variant: str, base: dict[str, Any], adapter: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """The merged weights of every adapted layer by the variant's formula, in float64 (DoRA: each output row
    of W + s B A rescaled to the trained magnitude; rsLoRA: s = alpha / sqrt(r))."""
    import math

    import torch

    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / math.sqrt(r) if cfg["use_rslora"] else alpha / r
    merged = {}
    for key, a in adapter.items():
        if not key.endswith("lora_A.weight"):
            continue
        prefix = key.removesuffix(".lora_A.weight")
        b = adapter[f"{prefix}.lora_B.weight"].double()
        module = prefix.removeprefix("base_model.model.")
        w = base[f"{module}.weight"].double() + scale * b @ a.double()
        if variant == "dora":
            magnitude = adapter[f"{prefix}.lora_magnitude_vector"].double()
            w = w * (magnitude / torch.linalg.norm(w, dim=1)).unsqueeze(1)
        merged[f"{module}.weight"] = w
    return merged


def test_variant_trains_and_exports_merged(tiny_model_dir: Path, variant_run: tuple[str, Path], tmp_path: Path) -> None:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rayft.recipes.export import export_model

    variant, run = variant_run
    config = json.loads((run / "final" / "adapter_config.json").read_text())
    expected_init = variant if variant in ("pissa", "olora") else True
    assert (config["use_dora"], config["use_rslora"], config["init_lora_weights"]) == (
        variant == "dora",
        variant == "rslora",
        expected_init,
    )
    adapter = load_file(str(run / "final" / "adapter_model.safetensors"))
    assert any("lora_magnitude_vector" in k for k in adapter) == (variant == "dora")

    result = export_model(load_config(None, [f"model.name={tiny_model_dir}"]), str(run), tmp_path / "merged")
    v = result.verification
    # The export merges in float64: merged and unmerged forwards differ by float64 rounding only (products of
    # 32- and 64-wide rows in two blocks, unit roundoff 1.1e-16, logits below 10), far under 1e-10.
    assert v["merge_max_abs_logit_diff"] <= 1e-10
    assert v["adapter_effect_max_abs_logit"] > 0 and v["reload_generate_ok"] is True
    exported = load_file(str(result.output_dir / "model.safetensors"))

    if variant in ("dora", "rslora"):
        # Direct computation: the stored float32 weights are the float64 formula rounded once (U32 of each
        # value), plus the float64 merge's own rounding (negligible beside it).
        base = load_file(str(tiny_model_dir / "model.safetensors"))
        for name, want in _expected_merge(variant, base, adapter, config).items():
            got = exported[name].double()
            assert torch.all((got - want).abs() <= U32 * want.abs() + 1e-12), name

    # Base + adapter as PEFT loads it (for PiSSA and OLoRA it rewrites the original base's weights again) in
    # float64, against the export in float64: only the float32 storage of the merged weights differs, U32
    # relative, which two blocks of 32-wide products keep below 1e-5 on these logits (below 10).
    tokenizer = AutoTokenizer.from_pretrained(result.output_dir)
    merged = AutoModelForCausalLM.from_pretrained(result.output_dir, dtype=torch.float64).eval()
    base32 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    unmerged = PeftModel.from_pretrained(base32, run / "final").to(torch.float64).eval()
    assert float((_logits(merged, tokenizer) - _logits(unmerged, tokenizer)).abs().max()) <= 1e-5


@pytest.mark.parametrize("init", ["pissa", "olora"])
def test_pissa_and_olora_start_from_the_base_model(tiny_model_dir: Path, init: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rayft.config.model import LoraConfig
    from rayft.training.modeling.model import prepare_training_model

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    before = _logits(base, tokenizer)
    q_before = base.model.layers[0].self_attn.q_proj.weight.detach().clone()
    model = prepare_training_model(base, LoraConfig(r=4, init=init, dropout=0.0), "lora", "eager", "cpu",
                                   gradient_checkpointing=False, compile_blocks=False).eval()  # fmt: skip
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    # The base keeps W minus its top-r part, the adapter starts as that part: the residual alone is not W...
    assert float((layer.base_layer.weight - q_before).abs().max()) > 1e-3
    # ...and residual + adapter is W up to float32 rounding of the split (U32 of |W| + |B A| per weight,
    # through two blocks of 32-wide products: below 1e-5 on these logits, below 10).
    assert float((_logits(model, tokenizer) - before).abs().max()) <= 1e-5
