"""Held-out scoring of a GRPO run while it trains: greedy completions of the validation prompts scored by the
rewards (``eval/reward``, ``eval/pass@1``, and ``eval/loss`` = minus the mean reward, which ranks checkpoints),
or, when a teacher alone trains, the reverse KL to it of sampled completions (``eval/distill/reverse_kl``).

Each worker decodes its own prompts (the method holds the weights whole meanwhile); the sums are reduced over
the ranks after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from rayft.evaluation.rewards import RewardSet
from rayft.training.loop.batches import Unit, micro_batches
from rayft.training.loop.session import all_reduce_sum
from rayft.training.methods.rl.distill import Distiller, sampled_reverse_kl
from rayft.training.methods.rl.sampling import PromptBatch, Sampler

if TYPE_CHECKING:
    import torch

    from rayft.training.modeling.model import TransformersModel

Collate = Callable[[list[Unit]], PromptBatch]  # the method's: prepared units as prompts and references


def reward_sums(
    inner: TransformersModel, units: Iterable[Unit], *, batch_size: int, collate: Collate, sampler: Sampler,
    rewards: RewardSet,
) -> list[float]:  # fmt: skip
    """The greedy completions' scores of ``units`` on this worker: the total reward, each function's, the
    solved completions (the first function gives 1) and the completions."""
    names = rewards.names
    sums = [0.0] * (len(names) + 3)
    for chunk in micro_batches(iter(units), batch_size):
        batch = collate(chunk)
        sampled = sampler.sample(inner, batch.prompts, 1, seed=None)
        scores = rewards.score(sampled.texts, batch.references, batch.rows_of_completions(1))
        sums[0] += sum(scores.total)
        for index, name in enumerate(names):
            sums[index + 1] += sum(scores.by_function[name])
        sums[-2] += sum(value >= 1.0 for value in scores.by_function[names[0]])
        sums[-1] += len(scores.total)
    return sums


def reward_figures(totals: Sequence[float], reward_names: Sequence[str]) -> dict[str, float]:
    """``eval/loss``, ``eval/reward`` (and each function's) and ``eval/pass@1`` of every rank's
    :func:`reward_sums`."""
    count = max(totals[-1], 1.0)
    figures = {"eval/loss": -totals[0] / count, "eval/reward": totals[0] / count, "eval/pass@1": totals[-2] / count}
    figures.update({f"eval/reward/{name}": totals[i + 1] / count for i, name in enumerate(reward_names)})
    return figures


def distillation_figures(
    inner: TransformersModel, units: Iterable[Unit], *, batch_size: int, device: torch.device, collate: Collate,
    sampler: Sampler, distiller: Distiller | None, seed: int,
) -> dict[str, float]:  # fmt: skip
    """``eval/distill/reverse_kl`` (also ``eval/loss``): the per-token reverse KL to the teacher on one
    completion of every validation prompt, sampled from the run's ``seed`` (every rank joins)."""
    assert distiller is not None  # the config allows no rewards only with distillation
    sums = [0.0, 0.0]
    for index, chunk in enumerate(micro_batches(iter(units), batch_size)):
        prompts = collate(chunk).prompts
        gap, tokens = sampled_reverse_kl(inner, sampler, distiller.teacher, prompts, seed + index)
        sums = [sums[0] + gap, sums[1] + tokens]
    gap, tokens = all_reduce_sum(sums, device)
    value = gap / max(tokens, 1.0)
    return {"eval/loss": value, "eval/distill/reverse_kl": value}
