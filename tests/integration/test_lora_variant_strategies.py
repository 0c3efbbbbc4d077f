"""The LoRA variants under every strategy that trains LoRA (2 Ray Train workers, gloo, CPU): a DoRA adapter
(its magnitude vector trained beside A and B) and a PiSSA-initialised one (the base weights rewritten on
every worker, a sharded one built on the meta device and filled from rank 0) train under FSDP (and, in the
slow tier, DeepSpeed ZeRO-3) as under DDP."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from tests.support.runs import adapter_tensors, tiny_config, train_losses, train_on

pytestmark = pytest.mark.integration

STEPS = ("train.max_steps=4", "train.save_steps=4", "train.eval_steps=null")
VARIANTS = {"dora": "lora.use_dora=true", "pissa": "lora.init=pissa"}


@pytest.fixture(scope="module")
def prepared(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    from rayft.config import ModelConfig
    from rayft.models.loading import load_tokenizer
    from rayft.testing.units import arithmetic_prepared

    tokenizer = load_tokenizer(ModelConfig(name=str(tiny_model_dir)))
    return arithmetic_prepared(tmp_path_factory.mktemp("units"), tokenizer, num_train=32)


@pytest.mark.parametrize(
    "strategy", ["fsdp", pytest.param("deepspeed", marks=pytest.mark.slow)], ids=["fsdp", "deepspeed"]
)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_trains_under_a_sharded_strategy_as_under_ddp(  # noqa: PLR0917 - fixtures
    ray_session: None, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path, variant: str, strategy: str
) -> None:
    runs = {}
    for name in ("ddp", strategy):
        cfg = tiny_config(tiny_model_dir, tmp_path / name, *STEPS, VARIANTS[variant], f"train.strategy={name}")
        runs[name] = train_on(cfg, prepared)
    want, got = (train_losses(runs[name]) for name in ("ddp", strategy))
    assert want.keys() == got.keys() == {1, 2, 3, 4}
    # The same updates in another order of float32 sums (all-reduce vs sharded gradients): losses within 1e-4.
    assert all(got[step] == pytest.approx(want[step], rel=1e-4) for step in want)
    want_tensors, got_tensors = (adapter_tensors(runs[name] / "final") for name in ("ddp", strategy))
    assert want_tensors.keys() == got_tensors.keys()
    assert any("lora_magnitude_vector" in k for k in want_tensors) == (variant == "dora")
    for name, tensor in want_tensors.items():
        assert (got_tensors[name] - tensor).abs().max() < 1e-5, name
