"""SFT with a KL penalty to the base model (``train.objective: sft_kl``): its KL term against TRL's
(``GKDTrainer.generalized_jsd_loss`` with ``beta=1``, its reverse KL) and its cross-entropy against torch's on
the same logits; a tiny in-process run with LoRA (the base is the adapter off) and with full fine-tuning (a
frozen copy), whose first step, taken from the base itself, has a KL of exactly 0."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError
from tests.support.runs import read_metrics

torch = pytest.importorskip("torch")

VOCAB, ROWS, POSITIONS = 64, 2, 5


def trl_reverse_kl_sum(logits: torch.Tensor, ref_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """TRL's generalized JSD at beta=1, summed over the masked positions: KL(student || teacher)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's notice on importing its experimental trainers
        from trl.experimental.gkd import GKDTrainer

    return GKDTrainer.generalized_jsd_loss(logits, ref_logits, labels=targets, beta=1.0, reduction="sum")


def test_the_kl_term_is_trls_reverse_kl_and_the_rest_is_the_cross_entropy() -> None:
    from rayft.training.methods.sft_kl.losses import kl_sft_loss

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(ROWS, POSITIONS, VOCAB, generator=generator, dtype=torch.float64)
    ref_logits = logits + 0.5 * torch.randn(ROWS, POSITIONS, VOCAB, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, VOCAB, (ROWS, POSITIONS), generator=generator)
    targets[0, :2] = -100  # a prompt: no loss there
    beta = 0.3

    result = kl_sft_loss(logits, ref_logits, targets, beta)
    kl = float(trl_reverse_kl_sum(logits, ref_logits, targets))
    nll = float(torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="sum"))
    # rayft computes in float32 against TRL's and torch's float64: each figure sums VOCAB * 8 masked positions
    # = 512 float32 terms, whose rounding is at most 512 * 1.2e-7 ~ 6e-5 of the sum.
    assert result.kl_sum == pytest.approx(kl, rel=6e-5)
    assert result.nll_sum == pytest.approx(nll, rel=6e-5)
    assert float(result.loss_sum) == pytest.approx(nll + beta * kl, rel=6e-5)
    assert kl > 0


def test_the_kl_term_of_the_base_itself_is_zero_and_pulls_nothing() -> None:
    from rayft.training.methods.sft_kl.losses import kl_sft_loss

    logits = torch.randn(ROWS, POSITIONS, VOCAB, requires_grad=True)
    targets = torch.randint(0, VOCAB, (ROWS, POSITIONS))
    with_kl = kl_sft_loss(logits, logits.detach(), targets, beta=5.0)
    (grad_with,) = torch.autograd.grad(with_kl.loss_sum, logits)
    (grad_without,) = torch.autograd.grad(kl_sft_loss(logits, logits.detach(), targets, beta=0.0).loss_sum, logits)
    assert with_kl.kl_sum == 0.0
    # KL's gradient vanishes where the distributions agree: float32 softmax rounding only (a few eps each).
    assert torch.allclose(grad_with, grad_without, atol=1e-6)


def sft_kl_config(model_dir: Path, storage: Path, *overrides: str):  # type: ignore[no-untyped-def]
    return load_config(None, [
        f"model.name={model_dir}", f"storage_path={storage}", "name=run", "scaling.num_workers=0",
        "data.datasets=[{path: 'builtin:arithmetic', max_rows: 16}]", "data.validation_fraction=0",
        "train.objective=sft_kl", "train.sft_kl.beta=0.5", "train.micro_batch_size=2", "train.max_steps=3",
        "train.logging_steps=1", "train.eval_steps=null", "train.learning_rate=2e-2", "lora.r=4", "lora.dropout=0",
        "logging.tensorboard=false", f"data.cache_dir={storage / 'cache'}", *overrides,
    ])  # fmt: skip


@pytest.mark.parametrize("method", ["lora", "full"])
def test_a_run_starts_at_the_base_with_zero_kl_and_then_moves_away(
    tiny_model_dir: Path, tmp_path: Path, method: str
) -> None:
    from rayft.runs.location import RunLocation
    from rayft.training.driver.run import default_launcher
    from rayft.training.driver.startup import build_worker_plan, claim_run_dir, prepare_training_data

    cfg = sft_kl_config(tiny_model_dir, tmp_path, f"train.method={method}")
    prepared = prepare_training_data(cfg, None, use_ray=False)
    run_dir = claim_run_dir(cfg, resume=False)
    default_launcher(cfg).launch(build_worker_plan(cfg, prepared, RunLocation(run_dir)), prepared)

    steps = {r["step"]: r for r in read_metrics(run_dir) if "train/loss" in r}
    assert sorted(steps) == [1, 2, 3]
    # Step 1 trains the base itself, and the loss is the cross-entropy alone. LoRA's B starts at 0: the adapter-off
    # forward is the same computation, KL exactly 0. A full run's base is a copy built apart: the same weights, whose
    # two log-softmaxes differ by float32 rounding (a few eps = 1.2e-7 per entry), and KL = sum p (log p - log q)
    # is bounded by that difference.
    assert steps[1]["sft_kl/kl"] == 0.0 if method == "lora" else abs(steps[1]["sft_kl/kl"]) < 1e-6
    assert steps[1]["train/loss"] == pytest.approx(steps[1]["sft_kl/nll"], rel=1e-6)
    assert steps[3]["sft_kl/kl"] > 0.0
    assert steps[3]["train/loss"] == pytest.approx(steps[3]["sft_kl/nll"] + 0.5 * steps[3]["sft_kl/kl"], rel=1e-5)
    assert (run_dir / "final").is_dir()


def test_sft_kl_refuses_packing_and_an_encoder_decoder_by_name(tiny_t5_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"train.objective='sft_kl' with data.packing=true: .* set data.packing=false"
    ):
        load_config(None, ["train.objective=sft_kl", "data.packing=true"])
    from rayft.runs.location import RunLocation
    from rayft.training.driver.startup import build_worker_plan, prepare_training_data
    from rayft.training.methods.registry import REGISTERED

    cfg = sft_kl_config(tiny_t5_dir, tmp_path)
    plan = build_worker_plan(cfg, prepare_training_data(cfg, None, use_ray=False), RunLocation(tmp_path / "run"))
    with pytest.raises(
        ConfigError, match="^train.objective=sft_kl trains a causal LM; model.name is an encoder-decoder$"
    ):
        REGISTERED.build(plan, None)  # type: ignore[arg-type]
