"""The figures of a GRPO run (``rl/*``): the sums a rank keeps of each rollout and update (:class:`RlRecord`),
their names in one order on every rank, and the means a logged record shows of their totals over the ranks.

Apart from the reduction over the ranks, pure arithmetic on the numbers the method
(:mod:`rayft.training.methods.rl.method`) adds up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rayft.config.rl import RlConfig
from rayft.training.loop.session import all_reduce_sum
from rayft.training.methods.rl import curriculum as cur
from rayft.training.methods.rl.distill import FIGURE_SUMS as DISTILL_SUMS
from rayft.training.methods.rl.distill import distill_figures
from rayft.training.methods.rl.dynamic_sampling import RECORD_FIGURES, record_figures
from rayft.training.methods.rl.episodes import episode_figure_names, episode_figures, episode_sums, tool_names
from rayft.training.methods.rl.losses import unbiased_std
from rayft.training.methods.rl.sampling import Completions

if TYPE_CHECKING:
    import torch

    from rayft.evaluation.rewards import Scores

# The sums every run keeps, whatever its rewards, environment and teacher.
FIXED_SUMS = (
    "completions", "groups", "reward", "reward_std", "zero_std_groups", "pass@1", "pass@k", "completion_length",
    "kl", "clip_low", "clip_high", "entropy", "loss_tokens", "rollout_tokens", "time/rollout_generate_s",
    "staleness", "rollout_batches", "importance_weight", "importance_capped", "importance_tokens",
    "prompts_all_solved", "prompts_none_solved", "truncated", "overlong_penalty", *RECORD_FIGURES, *cur.FIGURES,
)  # fmt: skip


@dataclass
class RlRecord:
    """This rank's figure sums since the last figures (every rank reduces them together: :meth:`take`), and the
    seconds of the parts of its last rollout."""

    settings: RlConfig
    reward_names: list[str]  # none when a teacher alone trains (train.rl.distillation)
    sums: dict[str, float] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)  # the last rollout's sampling and tool seconds
    counted_tools: list[str] | None = None  # the environment's tools, each counted apart

    def add(self, name: str, value: float) -> None:
        """Add ``value`` to this rank's sum of ``name`` since the last figures."""
        self.sums[name] = self.sums.get(name, 0.0) + value

    def add_all(self, sums: Iterable[tuple[str, float]]) -> None:
        """:meth:`add` each name and value of ``sums``."""
        for name, value in sums:
            self.add(name, value)

    def add_scores(self, scores: Scores, rewards: torch.Tensor, sampled: Completions) -> None:
        """The rollout's reward figures (:func:`score_sums`; ``rewards``: the shaped rewards the advantages see)."""
        group, names = self.settings.group_size, self.reward_names
        self.add_all(score_sums(scores, rewards, sampled.generated_tokens, group=group, reward_names=names))

    @property
    def tool_names(self) -> list[str]:
        """The tools whose calls the figures count apart (read from the environment once)."""
        if self.counted_tools is None:
            self.counted_tools = tool_names(self.settings.environment)
        return self.counted_tools

    def add_episodes(self, completions: Completions) -> None:
        """A multi-turn rollout's episode figures: turns, tool calls, errors, timeouts, cuts, tokens, seconds."""
        assert completions.episodes is not None
        self.add_all(episode_sums(completions.episodes, self.tool_names).items())
        self.add("time/rollout_sample_s", completions.seconds)
        self.add("time/rollout_tools_s", completions.tool_seconds)
        self.parts["rollout_sample"] = self.parts.get("rollout_sample", 0.0) + completions.seconds
        self.parts["rollout_tools"] = self.parts.get("rollout_tools", 0.0) + completions.tool_seconds

    def take_parts(self) -> dict[str, float]:
        """The last rollout's seconds of sampling and of the environment's steps (episodes only), and reset."""
        parts, self.parts = self.parts, {}
        return parts

    def take(self, device: torch.device, world_size: int, curriculum: cur.Curriculum | None) -> dict[str, float]:
        """The figures since the last call over every rank (:func:`mean_figures`; every rank joins), and reset;
        ``curriculum``: the run's, whose own sums join first."""
        tools = self.tool_names if self.settings.environment is not None else []  # read only with episodes
        names = figure_names(self.settings, self.reward_names, tools)
        if curriculum is not None:
            curriculum.take_sums(self.sums)
        total = dict(zip(names, all_reduce_sum([self.sums.get(n, 0.0) for n in names], device), strict=True))
        self.sums.clear()
        return mean_figures(total, self.settings, self.reward_names, tools, world_size=world_size)


def figure_names(settings: RlConfig, reward_names: Sequence[str], tool_names: Sequence[str]) -> list[str]:
    """Every sum a run's figures reduce, in one order on every rank (``tool_names``: the environment's tools,
    each counted apart)."""
    rewards = [f"reward/{n}" for n in reward_names] + [f"reward_errors/{n}" for n in reward_names]
    episodes = episode_figure_names(tool_names) if settings.environment is not None else []
    distilled = list(DISTILL_SUMS) if settings.distillation is not None else []
    return [*FIXED_SUMS, *rewards, *episodes, *distilled]


def score_sums(
    scores: Scores, rewards: torch.Tensor, generated_tokens: int, *, group: int, reward_names: Sequence[str]
) -> list[tuple[str, float]]:
    """A rollout's reward sums, to add: totals, each function's, errors, pass rates, group spread (of the shaped
    ``rewards`` the advantages see), lengths. A completion is solved when the first function gives it 1."""
    g, names = group, reward_names  # no names when a teacher alone trains (train.rl.distillation)
    grouped = rewards.view(-1, g)
    solved = [value >= 1.0 for value in scores.by_function[names[0]]] if names else [False] * len(scores.total)
    starts = range(0, len(solved), g)
    sums = [
        ("completions", float(len(scores.total))),
        ("groups", float(grouped.shape[0])),
        ("reward", sum(scores.total)),  # the functions' total; the overlong punishment has its own figure
        ("reward_std", float(unbiased_std(grouped, dim=1).sum())),
        ("zero_std_groups", float((grouped.max(dim=1).values == grouped.min(dim=1).values).sum())),
        ("pass@1", float(sum(solved))),
        ("pass@k", float(sum(any(solved[i : i + g]) for i in starts))),
        ("completion_length", float(generated_tokens)),
        # The basis of a curriculum: prompts every completion solved, and those none did.
        ("prompts_all_solved", float(sum(all(solved[i : i + g]) for i in starts))),
        ("prompts_none_solved", float(sum(not any(solved[i : i + g]) for i in starts))),
    ]
    for name in names:
        sums.append((f"reward/{name}", sum(scores.by_function[name])))
        sums.append((f"reward_errors/{name}", float(scores.errors[name])))
    return sums


def mean_figures(
    total: dict[str, float], settings: RlConfig, reward_names: Sequence[str], tool_names: Sequence[str], *,
    world_size: int,
) -> dict[str, float]:  # fmt: skip
    """The figures of every rank's sums, ``total``: means per completion, per group or per completion token;
    counts of reward errors; rollout tokens per second of generation. Without reward functions (a teacher
    alone trains) there is no reward to report."""
    completions = max(total["completions"], 1.0)
    figures = step_figures(total, settings, world_size=world_size)
    for name in reward_names:
        figures[f"rl/reward/{name}"] = total[f"reward/{name}"] / completions
        figures[f"rl/reward_errors/{name}"] = total[f"reward_errors/{name}"]
    if settings.environment is not None:
        figures.update(episode_figures(total, tool_names, world_size))
    if settings.distillation is not None:
        figures.update(distill_figures(total, world_size))
    if not reward_names:
        figures = {k: v for k, v in figures.items() if not k.startswith(("rl/reward", "rl/pass@", "rl/zero_std"))}
    return figures


def step_figures(total: dict[str, float], settings: RlConfig, *, world_size: int) -> dict[str, float]:
    """The figures every run shows (and those of its KL term, dynamic sampling, curriculum and importance
    weights when it has them), from every rank's sums."""
    completions, groups = max(total["completions"], 1.0), max(total["groups"], 1.0)
    tokens = max(total["loss_tokens"], 1.0)
    figures = {
        "rl/reward": total["reward"] / completions,
        "rl/reward_std": total["reward_std"] / groups,
        "rl/zero_std_groups": total["zero_std_groups"] / groups,
        "rl/pass@1": total["pass@1"] / completions,
        f"rl/pass@{settings.group_size}": total["pass@k"] / groups,
        "rl/completion_length": total["completion_length"] / completions,
        "rl/entropy": total["entropy"] / tokens,
        "rl/clip_fraction": (total["clip_low"] + total["clip_high"]) / tokens,
        "rl/staleness": total["staleness"] / max(total["rollout_batches"], 1.0),
        # Generation runs on every rank at once: tokens of all ranks over one rank's mean generating time.
        "rl/rollout_tokens_per_s": total["rollout_tokens"] / max(total["time/rollout_generate_s"] / world_size, 1e-9),
    }
    if settings.kl_coef:
        figures["rl/kl"] = total["kl"] / tokens
    figures.update(record_figures(total, completions, settings))
    if settings.curriculum is not None:
        figures.update(cur.figures(total))
    rollout = settings.rollout
    if rollout.max_staleness and rollout.importance_cap is not None:
        # Over the tokens of stale rollouts only (none: the weights are 1).
        weighed = total["importance_tokens"]
        figures["rl/importance_weight"] = total["importance_weight"] / weighed if weighed else 1.0
        figures["rl/importance_capped"] = total["importance_capped"] / max(weighed, 1.0)
    return figures
