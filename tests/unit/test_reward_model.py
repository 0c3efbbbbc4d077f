"""The Bradley-Terry reward model (``train.objective: reward_model``): its loss against a direct float64
computation and against TRL's ``RewardTrainer.compute_loss`` on the same classifier and pairs; its figures;
the RL reward's config, normalisation and refusal of a bad path."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from rayft.config.rl import RewardConfig
from rayft.errors import ConfigError

torch = pytest.importorskip("torch")

PAD = 0


def tiny_classifier() -> Any:
    """A random-init 2-layer Llama sequence classifier with one output, in float64."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=PAD)  # fmt: skip
    return LlamaForSequenceClassification(config).double().eval()


def pair_units(pairs: int) -> list[dict[str, Any]]:
    """Pair units of different lengths (so that rows are padded), token ids never the pad id."""
    generator = torch.Generator().manual_seed(1)
    units = []
    for i in range(pairs):
        sides = {}
        for side, length in (("chosen", 4 + i), ("rejected", 7 - i % 3)):
            ids = torch.randint(1, 40, (length,), generator=generator).tolist()
            sides[f"{side}_input_ids"], sides[f"{side}_labels"] = ids, [-100] * 2 + ids[2:]
        units.append({**sides, "sample_ids": [i]})
    return units


def trl_loss(model: Any, units: list[dict[str, Any]], margin: float, center: float | None) -> tuple[float, dict]:
    """TRL's RewardTrainer.compute_loss on ``units`` (chosen rows then rejected rows, right-padded, with TRL's
    attention mask and a margin column), and the figures it records, on one process."""
    from accelerate import Accelerator
    from trl import RewardTrainer

    rows = [u["chosen_input_ids"] for u in units] + [u["rejected_input_ids"] for u in units]
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    inputs = {"input_ids": input_ids, "attention_mask": mask, "margin": torch.full((len(units),), margin)}
    metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer = SimpleNamespace(model=model, args=SimpleNamespace(center_rewards_coefficient=center),
                              accelerator=Accelerator(cpu=True), _metrics=metrics, _total_train_tokens=0,
                              _tp_size=1)  # fmt: skip
    with torch.no_grad():
        loss = RewardTrainer.compute_loss(trainer, model, inputs)  # type: ignore[arg-type]
    return float(loss), {k: v[0] for k, v in metrics["eval"].items()}


@pytest.mark.parametrize(("margin", "center"), [(0.0, None), (0.25, 0.01)])
def test_the_loss_is_trls_reward_trainer_loss_on_the_same_classifier(margin: float, center: float | None) -> None:
    from rayft.training.methods.reward_model.losses import bradley_terry_losses, figure_sums
    from rayft.training.methods.reward_model.method import collate_pairs, pair_scores

    model, units = tiny_classifier(), pair_units(5)
    batch = collate_pairs(units, PAD)
    with torch.no_grad():
        scores = pair_scores(model, batch.rows, None)
    losses = bradley_terry_losses(scores, margin=margin, center_coefficient=center)
    want, figures = trl_loss(model, units, margin, center)
    # rayft reads the classifier's float64 scores in float32 (relative rounding 6e-8), and its pooling sees the
    # same real tokens as TRL's masked forward (right padding): the mean of 5 losses agrees to float32 rounding.
    assert float(losses.mean()) == pytest.approx(want, rel=1e-6)
    sums = figure_sums(scores)
    assert float(sums["accuracy"]) == round(5 * figures["accuracy"])  # TRL's is a float32 mean of 5 counts
    assert float(sums["margin"]) / 5 == pytest.approx(figures["margin"], rel=1e-6)
    assert 0 < float(sums["accuracy"]) < 5  # a random head: the pairs are not all one way (the check can fail)


def test_the_loss_is_the_bradley_terry_negative_log_likelihood() -> None:
    from rayft.training.methods.reward_model.losses import PairScores, bradley_terry_losses

    chosen = torch.tensor([2.0, -1.0, 0.5, 30.0, -30.0], dtype=torch.float64)
    rejected = torch.tensor([1.0, 1.0, 0.5, -30.0, 30.0], dtype=torch.float64)
    got = bradley_terry_losses(PairScores(chosen, rejected), margin=0.5, center_coefficient=0.1)
    pairs = zip(chosen.tolist(), rejected.tolist(), strict=True)
    want = [math.log1p(math.exp(-(c - r - 0.5))) + 0.1 * (c + r) ** 2 for c, r in pairs]
    # float32 arithmetic on these magnitudes (up to 60.5 for the last pair): relative rounding ~1e-7.
    assert got.tolist() == pytest.approx(want, rel=1e-6)
    assert got.dtype == torch.float32


def test_the_config_needs_a_reward_model_section_and_only_that_function_reads_one() -> None:
    with pytest.raises(ValidationError, match="needs a reward_model section"):
        RewardConfig(function="reward_model")
    with pytest.raises(ValidationError, match="only 'reward_model' reads one"):
        RewardConfig(function="math", reward_model={"path": "x"})  # type: ignore[arg-type]
    cfg = RewardConfig(function="reward_model", reward_model={"path": "org/rm", "prompt_column": "question"})  # type: ignore[arg-type]
    assert cfg.columns == ("question",) and cfg.label == "reward_model"


def test_a_bad_path_is_one_line_naming_the_field_and_the_fix(tmp_path: Path) -> None:
    from rayft.evaluation.rewards import RewardSet

    missing = RewardConfig(function="reward_model", reward_model={"path": str(tmp_path / "nope")})  # type: ignore[arg-type]
    where = r"^train\.rl\.rewards\[\]\.reward_model\.path='.*nope': no such directory; give the final/ directory"
    with pytest.raises(ConfigError, match=where + r" of a train\.objective=reward_model run"):
        RewardSet.build([missing], max_new_tokens=16)
    (tmp_path / "empty").mkdir()
    empty = RewardConfig(function="reward_model", reward_model={"path": str(tmp_path / "empty")})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"holds neither a model \(config.json\) nor a LoRA adapter") as error:
        RewardSet.build([empty], max_new_tokens=16)
    assert "\n" not in str(error.value)


def test_a_causal_lm_or_a_classifier_of_two_outputs_is_refused_as_a_reward_model(tmp_path: Path) -> None:
    from transformers import LlamaConfig

    from rayft.evaluation.reward_model import load_reward_model

    LlamaConfig(architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"the model there is LlamaForCausalLM, not a sequence classifier"):
        load_reward_model(str(tmp_path), "float32")
    LlamaConfig(architectures=["LlamaForSequenceClassification"], num_labels=2).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"the classifier has 2 outputs, a reward model one"):
        load_reward_model(str(tmp_path), "float32")


def test_a_relative_path_is_anchored_where_the_config_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rayft.config.reward_model import RewardModelConfig

    (tmp_path / "runs" / "rm").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert RewardModelConfig(path="runs/rm").path == str(tmp_path / "runs" / "rm")
    assert RewardModelConfig(path="org/reward-model").path == "org/reward-model"  # a Hub id


def test_normalisation_of_scores() -> None:
    from rayft.evaluation.reward_model import normalized

    scores = [-800.0, -1.0, 0.0, 3.0]
    assert normalized(scores, "none") == scores
    assert normalized(scores, "sigmoid") == pytest.approx([0.0, 1 / (1 + math.e), 0.5, 1 / (1 + math.exp(-3))])
    batch = normalized([1.0, 2.0, 3.0], "batch")
    assert batch == pytest.approx([-math.sqrt(1.5), 0.0, math.sqrt(1.5)])
    assert normalized([2.0, 2.0], "batch") == [0.0, 0.0]
