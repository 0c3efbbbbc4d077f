"""A Bradley-Terry reward model trained end to end on a tiny random model (in process, LoRA with its score
head), beating chance on held-out pairs; its final/ directory loads with transformers'
AutoModelForSequenceClassification and serves as the RL reward 'reward_model'.

The pairs are separable by one feature: every chosen answer ends with '!', every rejected one with '?'."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from rayft.config.rl import RewardConfig
from tests.support.runs import read_metrics, tiny_config, train_on

pytestmark = pytest.mark.integration

PAIRS, HELD_OUT = 160, 64  # data.validation_fraction=0.4 holds out 64 of the 160 pairs


def pair_rows(count: int) -> list[dict[str, str]]:
    """``count`` pairs: a sum as the prompt, its answer with '!' chosen and with '?' rejected."""
    return [{"prompt": f"Question: {i} + {i % 7}\nAnswer: ", "chosen": f"{i + i % 7}!", "rejected": f"{i + i % 7}?"}
            for i in range(count)]  # fmt: skip


def chance_threshold(n: int, alpha: float) -> int:
    """The least k with P(Binomial(n, 1/2) >= k) < alpha: a model at chance reaches k correct pairs of n
    with probability under alpha."""
    tail = 0.0
    for k in range(n, -1, -1):
        tail += math.comb(n, k) / 2**n
        if tail >= alpha:
            return k + 1
    return 0


def train_reward_model(model_dir: Path, root: Path, *overrides: str) -> Path:
    """A reward model trained in process on the pairs, 24 steps of 8 pairs by default; the run directory."""
    from rayft.training.driver.startup import prepare_training_data

    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(row) + "\n" for row in pair_rows(PAIRS)))
    cfg = tiny_config(
        model_dir, root / "runs", "scaling.num_workers=0", "train.objective=reward_model",
        f"data.datasets=[{{path: {pairs}}}]", "data.validation_fraction=0.4", f"data.cache_dir={root / 'cache'}",
        "train.max_steps=24", "train.micro_batch_size=8", "train.learning_rate=1e-2", "train.save_steps=24",
        "train.eval_steps=24", "train.logging_steps=1", "lora.dropout=0", *overrides,
    )  # fmt: skip
    return train_on(cfg, prepare_training_data(cfg, None, use_ray=False))


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_reward_model(tiny_model_dir, tmp_path_factory.mktemp("reward-model"))


def test_the_reward_model_beats_chance_on_held_out_pairs(run_dir: Path) -> None:
    records = read_metrics(run_dir)
    steps = [r for r in records if "train/loss" in r]
    assert steps[0]["train/loss"] == pytest.approx(math.log(2), abs=0.05)  # a fresh head scores ~0: loss ln 2
    assert {"reward_model/accuracy", "reward_model/margin"} <= steps[-1].keys()
    evaluation = next(r for r in records if "eval/pair_accuracy" in r)
    # Under chance every held-out pair is a fair coin: accuracy at or above k / 64 has probability < 1e-3.
    assert HELD_OUT * evaluation["eval/pair_accuracy"] >= chance_threshold(HELD_OUT, 1e-3), evaluation
    assert evaluation["eval/margin"] > 0


def test_final_loads_as_a_sequence_classifier_and_scores_as_the_rl_reward(run_dir: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rayft.evaluation.rewards import RewardSet

    final = run_dir / "final"
    assert (final / "adapter_config.json").is_file() and not (final / "generation_config.json").exists()
    cfg = RewardConfig(function="reward_model", reward_model={"path": str(final), "batch_size": 5})  # type: ignore[arg-type]
    rewards = RewardSet.build([cfg], max_new_tokens=16)
    held = pair_rows(PAIRS + 40)[PAIRS:]  # prompts no run has seen
    rows: list[dict[str, Any]] = [{"prompt": r["prompt"]} for r in held]
    chosen = rewards.score([r["chosen"] for r in held], [""] * len(held), rows)
    rejected = rewards.score([r["rejected"] for r in held], [""] * len(held), rows)
    assert chosen.errors == {"reward_model": 0}
    wins = sum(c > r for c, r in zip(chosen.total, rejected.total, strict=True))
    assert wins >= chance_threshold(len(held), 1e-3), (chosen.total, rejected.total)

    # transformers loads the adapter and its score head on the base it names, and scores as the reward did.
    scorer = rewards.functions[0].fn.one  # type: ignore[attr-defined]
    model = AutoModelForSequenceClassification.from_pretrained(final, num_labels=1).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    text = scorer.conversation(held[0]["chosen"], rows[0])
    with torch.no_grad():
        direct = float(model(**tokenizer(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0])
    # One conversation, the same float32 weights: the merged adapter differs from the unmerged one by rounding.
    assert chosen.total[0] == pytest.approx(direct, rel=1e-4, abs=1e-5)


def test_full_fine_tuning_saves_a_classifier_that_loads_alone(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoConfig

    from rayft.evaluation.rewards import RewardSet

    full = ("train.method=full", "train.max_steps=4", "train.save_steps=4", "train.eval_steps=4",
            "train.learning_rate=1e-3")  # fmt: skip
    final = train_reward_model(tiny_model_dir, tmp_path, *full) / "final"
    config = AutoConfig.from_pretrained(final)  # no num_labels to pass: the saved config says it
    assert config.architectures == ["LlamaForSequenceClassification"] and config.num_labels == 1
    cfg = RewardConfig(function="reward_model", reward_model={"path": str(final), "normalize": "sigmoid"})  # type: ignore[arg-type]
    scores = RewardSet.build([cfg], max_new_tokens=16).score(
        ["7!", "7?"], ["", ""], [{"prompt": "Question: 5 + 2"}] * 2
    )
    assert scores.errors == {"reward_model": 0} and all(0 < s < 1 for s in scores.total)
