"""GRPO's figures from its sums: a rollout's reward sums (solved completions and groups, the groups' spread),
the means a record shows over completions, groups and tokens, and no reward figures when a teacher alone trains."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rayft.config.rl import RlConfig  # noqa: E402
from rayft.evaluation.rewards import Scores  # noqa: E402
from rayft.training.methods.rl.figures import RlRecord, figure_names, mean_figures, score_sums  # noqa: E402
from rayft.training.methods.rl.sampling import Completions  # noqa: E402

# Two prompts of two completions: the first group split (1, 0), the second all solved (1, 1).
SOLVED = [1.0, 0.0, 1.0, 1.0]
SCORES = Scores(SOLVED, {"exact_match": SOLVED}, {"exact_match": 1})
SAMPLED = Completions([[5], [6, 7], [8], [9]], ["a", "b", "c", "d"], 17, 2.0)


def settings() -> RlConfig:
    return RlConfig(rewards=[{"function": "exact_match"}], group_size=2)


def test_a_rollouts_sums_count_solved_completions_and_groups_and_the_groups_spread() -> None:
    sums = dict(score_sums(SCORES, torch.tensor(SOLVED), 17, group=2, reward_names=["exact_match"]))
    assert sums.pop("reward_std") == pytest.approx(math.sqrt(0.5))  # unbiased std of (1, 0); (1, 1) has none
    assert sums == {
        "completions": 4.0, "groups": 2.0, "reward": 3.0, "zero_std_groups": 1.0, "pass@1": 3.0, "pass@k": 2.0,
        "completion_length": 17.0, "prompts_all_solved": 1.0, "prompts_none_solved": 0.0,
        "reward/exact_match": 3.0, "reward_errors/exact_match": 1.0,
    }  # fmt: skip


def test_the_record_reports_means_per_completion_group_and_token_and_starts_again() -> None:
    record = RlRecord(settings(), ["exact_match"])
    record.add_scores(SCORES, torch.tensor(SOLVED), SAMPLED)
    for name, value in {"loss_tokens": 10.0, "entropy": 5.0, "clip_low": 1.0, "clip_high": 1.0,
                        "time/rollout_generate_s": 2.0, "rollout_tokens": 17.0}.items():  # fmt: skip
        record.add(name, value)
    figures = record.take(torch.device("cpu"), world_size=2, curriculum=None)
    assert figures["rl/reward"] == figures["rl/pass@1"] == figures["rl/reward/exact_match"] == 0.75
    assert figures["rl/pass@2"] == 1.0 and figures["rl/zero_std_groups"] == 0.5
    assert figures["rl/entropy"] == 0.5 and figures["rl/clip_fraction"] == 0.2
    assert figures["rl/rollout_tokens_per_s"] == 17.0  # both ranks' tokens over one rank's mean 1 s
    assert figures["rl/reward_errors/exact_match"] == 1.0 and "rl/kl" not in figures  # kl_coef 0
    assert record.take(torch.device("cpu"), world_size=2, curriculum=None)["rl/reward"] == 0.0


def test_without_reward_functions_no_reward_figure_is_reported() -> None:
    total = dict.fromkeys(figure_names(settings(), [], []), 1.0)
    figures = mean_figures(total, settings(), [], [], world_size=1)
    assert "rl/entropy" in figures
    assert not [k for k in figures if k.startswith(("rl/reward", "rl/pass@", "rl/zero_std"))]
