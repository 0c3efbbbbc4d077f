"""Online reinforcement learning (``train.objective: grpo``) through the loop's objective seam.

A training unit is a prompt: a prepared row whose prompt tokens are its unlabelled prefix and whose
response (the labelled tokens, decoded) is the reference the rewards compare with, so any dataset the
SFT path reads (GSM8K, the built-in sets, SDG output) is a prompt set, read, sharded and resumed as
SFT's units are. Before each training step every worker has ``group_size`` completions of each of its
prompts sampled with the policy (on itself, or on generation actors kept in step with its weights:
:mod:`rayft.training.methods.rl.rollout_actors`), scores them with the rewards, turns rewards into group-relative
advantages, and the step trains on the completions (:mod:`rayft.training.methods.rl.losses`).

A micro-batch's samples are seeded by (run seed, step, its first prompt's sample id): a resumed run samples
the same completions as an uninterrupted one, 1 worker draws what 2 workers draw for the same micro-batches
of prompts (as its SFT steps equal theirs for the same micro-batches), and an HF generation actor draws
what the trainer draws. With one update per rollout the samples are on-policy, so the probability ratio of
the clipped loss is 1 with the gradient of the log-probabilities (TRL's ``num_iterations=1``); with
``steps_per_rollout`` > 1 the rollout policy's per-token log-probabilities are recorded before the first
update and the ratio to them is clipped on the updates after it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rayft.config.rl import RlConfig
from rayft.data.collate import MicroBatch, collate
from rayft.data.prepared import IGNORE_INDEX
from rayft.errors import ConfigError, DataError
from rayft.evaluation.rewards import RewardSet, Scores
from rayft.training.loop.batches import Batch, OnRows, TrainBatch, Unit, micro_batches
from rayft.training.loop.method import MethodHooks
from rayft.training.loop.objective import CausalLm
from rayft.training.loop.session import TrainSession, all_reduce_sum
from rayft.training.methods.rl import curriculum as cur
from rayft.training.methods.rl.distill import FIGURE_SUMS as DISTILL_SUMS
from rayft.training.methods.rl.distill import (
    Distiller,
    build_teacher,
    distill_figures,
    distillation_loss,
    sampled_reverse_kl,
)
from rayft.training.methods.rl.dynamic_sampling import (
    RECORD_FIGURES,
    RefillStream,
    Scored,
    packed_state,
    record_figures,
    refill_seed,
    refilled,
    unpacked_state,
)
from rayft.training.methods.rl.episodes import (
    episode_figure_names,
    episode_figures,
    episode_scores,
    episode_sums,
    tool_names,
)
from rayft.training.methods.rl.losses import (
    POLICY_LOSSES,
    PolicyLossSettings,
    completion_logps,
    group_advantages,
    importance_weights,
    kept_positions,
    policy_loss,
    unbiased_std,
)
from rayft.training.methods.rl.overlong import shaped_rewards, truncated
from rayft.training.methods.rl.rollout_actors import ColocatedRollouts, Rollouts
from rayft.training.methods.rl.rollout_plan import staleness
from rayft.training.methods.rl.sampling import Completions, PromptBatch, Sampler
from rayft.training.methods.rl.setup import build_worker_rollouts, read_rollouts_ahead
from rayft.training.modeling.attention import row_multiple
from rayft.training.modeling.model import check_adapter_off_is_base, transformers_model

if TYPE_CHECKING:
    import torch
    from peft import PeftModel

    from rayft.training.modeling.model import TransformersModel
    from rayft.training.modeling.precision import Precision
    from rayft.training.strategies.parallel import Parallelism

log = logging.getLogger("rayft.train")


@dataclass
class RolloutBatch(OnRows):
    """A micro-batch of sampled completions, ready to train on: each row a prompt and one completion
    (labels on the completion), with its advantage and, for the KL penalty, its reference log-probabilities."""

    rows: MicroBatch
    advantages: torch.Tensor
    ref_logps: torch.Tensor | None
    terms: int
    old_logps: torch.Tensor | None = None  # the rollout policy's, when the rollout is trained on more than once
    # The sampling weights' log-probabilities of a stale rollout, (rows, target positions) of ``rows``.
    behaviour_logps: torch.Tensor | None = None
    weight: float = 1.0  # 0: a batch that only keeps the workers in lockstep (dynamic sampling found nothing)
    teacher_logps: torch.Tensor | None = None  # on-policy distillation's teacher, the policy's layout

    @property
    def num_label_tokens(self) -> int:
        """Loss terms (completions, or completion tokens with the 'dapo' loss)."""
        return self.terms

    def to(self, device: torch.device) -> RolloutBatch:
        """The same batch with its tensors on ``device``."""
        ref = None if self.ref_logps is None else self.ref_logps.to(device)
        old = None if self.old_logps is None else self.old_logps.to(device)
        behaviour = None if self.behaviour_logps is None else self.behaviour_logps.to(device)
        teacher = None if self.teacher_logps is None else self.teacher_logps.to(device)
        return RolloutBatch(self.rows.to(device), self.advantages.to(device), ref, self.terms, old, behaviour,
                            self.weight, teacher)  # fmt: skip


def behaviour_rows(units: Sequence[Unit], behaviour: Sequence[Sequence[float]], rows: MicroBatch) -> torch.Tensor:
    """Each unit's ``behaviour`` log-probabilities (one per trained token: a completion's sampled tokens) laid
    out as the rows' target positions (``labels[:, 1:]``, 0 elsewhere)."""
    import torch

    out = torch.zeros(rows.labels.shape[0], rows.labels.shape[1] - 1, dtype=torch.float32)
    for index, (unit, values) in enumerate(zip(units, behaviour, strict=True)):
        # Target t predicts token t + 1: the trained token at position p is target p - 1.
        targets = [i - 1 for i, label in enumerate(unit["labels"]) if label != IGNORE_INDEX]
        if values and targets:  # not: nothing sampled, or a truncated completion masked out of the loss
            out[index, targets] = torch.tensor(values, dtype=torch.float32)
    return out


def masked(completion: Sequence[int], mask: Sequence[int]) -> list[int]:
    """A completion's labels: its tokens where ``mask`` is 1 (sampled), IGNORE_INDEX where 0 (an environment's)."""
    return [token if keep else IGNORE_INDEX for token, keep in zip(completion, mask, strict=True)]


def split_unit(unit: Unit) -> tuple[list[int], list[int]]:
    """A prepared row's prompt (the tokens before its first label) and its response tokens (the labelled)."""
    ids, labels = list(unit["input_ids"]), list(unit["labels"])
    first = next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(ids))
    return ids[:first], [t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]


def carried_row(unit: Unit) -> dict[str, Any]:
    """The columns a prepared prompt carries to the rewards (its ``row`` column, see
    :mod:`rayft.data.prepared`); DataError when the prepared data has none."""
    text = unit.get("row")
    if not text:
        raise DataError(
            "train.rl: the rewards read each row's columns, but the prepared data carries none; prepare the data "
            "with this config (rayft data prepare <config>, or let rayft train prepare it)"
        )
    return cast("dict[str, Any]", json.loads(text))


@dataclass
class RlTraining(MethodHooks):
    """The :class:`~rayft.training.loop.method.Method` of GRPO and its variants: the model, its files
    and checkpoints are :class:`~rayft.training.loop.objective.CausalLm`'s (LoRA or full); a step's batches
    are prompts, from which it samples and scores rollouts to train on with the clipped policy loss."""

    lm: CausalLm
    settings: RlConfig
    rewards: RewardSet
    seed: int
    reference_model: torch.nn.Module | None = None
    sums: dict[str, float] = field(default_factory=dict)  # this rank's figure sums since take_figures()
    throughput_unit: str = "tokens"
    rollouts: Rollouts | None = None  # where the worker's rollouts are sampled, from start() on
    saved_ahead: str | None = None  # the rollouts sampled ahead at the checkpoint the run resumes from
    counted_tools: list[str] | None = None  # the environment's tools, each counted apart in the figures
    parts: dict[str, float] = field(default_factory=dict)  # the last rollout's sampling and tool seconds
    refill: RefillStream | None = None  # dynamic sampling's extra prompts, from start() on
    saved_refill: dict[str, Any] | None = None  # their cursor at the checkpoint the run resumes from
    curriculum: cur.Curriculum | None = None  # the curriculum's queue of variants, from start() on
    saved_curriculum: dict[str, Any] | None = None  # the queue at the checkpoint the run resumes from
    distiller: Distiller | None = None  # train.rl.distillation's teacher, from build_model() on
    parallel: Parallelism | None = None  # the run's strategy, from use_strategy() on

    @classmethod
    def build(cls, lm: CausalLm, settings: RlConfig, seed: int) -> RlTraining:
        """The objective, with the reward functions loaded (a user's module fails here, at start)."""
        if lm.seq2seq:
            raise ConfigError("train.objective=grpo trains a causal LM; model.name is an encoder-decoder")
        rewards = RewardSet.build(settings.rewards, settings.max_new_tokens, settings.row_columns)
        return cls(lm, settings, rewards, seed)

    @property
    def model_type(self) -> str:
        """The base model's type, for the precision checks."""
        return self.lm.model_type

    @property
    def loss_settings(self) -> PolicyLossSettings:
        """The policy loss's settings."""
        s = self.settings
        return PolicyLossSettings(s.loss, s.epsilon, s.clip_high, s.kl_coef, s.max_new_tokens)

    def build_model(self, restore_dir: Path | None, *, device_type: str, weights: bool) -> torch.nn.Module:
        """The model :class:`CausalLm` builds, and the frozen reference copy when the KL penalty asks for one."""
        model = self.lm.build_model(restore_dir, device_type=device_type, weights=weights)
        if self.reference_kind == "copy":
            from rayft.models.loading import load_causal_lm

            reference: torch.nn.Module = load_causal_lm(self.lm.plan.model, device_type)
            self.reference_model = reference.eval().requires_grad_(False)
        if self.settings.distillation is not None:
            teacher = build_teacher(self.settings.distillation, self.lm.plan.model, self.lm.tokenizer, device_type)
            self.distiller = Distiller(self.settings.distillation, teacher)
        return model

    @property
    def reference_kind(self) -> str:
        """:meth:`~rayft.config.rl.RlConfig.reference_kind` of this run's method."""
        return self.settings.reference_kind(self.lm.plan.train.method)

    def write_model(self, model: torch.nn.Module, directory: Path, state_dict: dict[str, torch.Tensor] | None) -> None:
        """The files :class:`CausalLm` writes."""
        self.lm.write_model(model, directory, state_dict)

    def collate(self, units: list[Unit]) -> PromptBatch:
        """The units' prompts, references (decoded response text) and, when the rewards read rows, the
        columns carried with them."""
        prompts, references = [], []
        for unit in units:
            prompt, response = split_unit(unit)
            prompts.append(prompt)
            references.append(cast("str", self.lm.tokenizer.decode(response, skip_special_tokens=True)))  # one text
        carried = self.rewards.reads_rows or (self.settings.environment is not None and self.settings.carried_columns)
        rows = [carried_row(unit) for unit in units] if carried else []
        return PromptBatch(prompts, references, [int(i) for u in units for i in u["sample_ids"]], rows)

    # -- the step ---------------------------------------------------------------------------------------

    @property
    def updates_per_step(self) -> int:
        """``train.rl.steps_per_rollout`` updates on each rollout."""
        return self.settings.steps_per_rollout

    @property
    def lookahead(self) -> int:
        """The steps whose prompts asynchronous rollouts sample while one trains (``rollout.max_staleness``)."""
        return self.settings.rollout.max_staleness

    @property
    def prepare_phase(self) -> str:
        """Sampling and scoring count as the step's 'rollout'."""
        return "rollout"

    def restore(self, restore_dir: Path | None, rank: int) -> None:
        """Keep the rollouts this rank had sampled ahead at the checkpoint (asynchronous rollouts)."""
        inner, self.saved_curriculum = cur.unpacked_state(read_rollouts_ahead(restore_dir, rank))
        self.saved_ahead, self.saved_refill = unpacked_state(inner)

    def use_strategy(self, parallel: Parallelism) -> None:
        """Keep the strategy: under a sharded one the weights are gathered whole to sample with."""
        self.parallel = parallel

    def whole(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """The weights whole on this worker for the duration (every worker enters together): each worker samples
        until its own completions end, so its forwards differ in number from another's and must run no
        collective (a sharded strategy's per-block gathers would deadlock). Nothing to do under DDP."""
        return self.parallel.whole_weights(model) if self.parallel is not None else contextlib.nullcontext()

    def start(self, session: TrainSession) -> None:
        """Where this worker's rollouts are sampled (its generation actors started, with actors)."""
        self.rollouts = build_worker_rollouts(self.lm.plan, session, self.sampler, self.saved_ahead)
        if self.settings.dynamic_sampling is not None:
            plan = self.lm.plan
            self.refill = RefillStream(lambda: session.windows("train", plan.shuffle_window), plan.seed, session.rank)
            if self.saved_refill is not None:
                self.refill.restore(self.saved_refill)
        if self.settings.curriculum is not None:
            codec = cur.TokenizerCodec(self.lm.tokenizer)
            self.curriculum = cur.Curriculum.build(self.settings.curriculum, codec, self.seed, session.rank)
            if self.saved_curriculum is not None:
                self.curriculum.restore(self.saved_curriculum)

    def prepare(
        self, model: torch.nn.Module, batches: list[Batch], ahead: list[list[Batch]], *, step: int,
        precision: Precision, device: torch.device,
    ) -> list[TrainBatch]:  # fmt: skip
        """The step's completions, sampled from its prompts (and the next steps' prompts sent to asynchronous
        generation actors) and scored."""
        assert self.rollouts is not None  # start() ran
        prompts = cast("list[PromptBatch]", batches)  # what collate() made
        if self.curriculum is not None:  # queued variants take the place of the step's last prompts
            prompts = self.curriculum.serve(prompts)
        # Gathered also with actors: the first weights they are sent, dynamic sampling's refills and the forwards
        # of the reference and old log-probabilities run here.
        with self.whole(model):
            sampled = self.rollouts.sample(model, step, prompts, cast("list[list[PromptBatch]]", ahead))
            rollout = self.rollout(model, prompts, sampled, step=step, precision=precision)
        return [batch.to(device) for batch in rollout]

    def after_update(self, model: torch.nn.Module, step: int) -> None:
        """Send the generation actors (if any) the new weights."""
        assert self.rollouts is not None
        if isinstance(self.rollouts, ColocatedRollouts):
            return  # nothing travels: the next rollout samples from the model itself
        with self.whole(model):
            self.rollouts.after_update(model, step)

    @property
    def rank_state(self) -> Callable[[], str | None] | None:
        """The rollouts sampled ahead (and dynamic sampling's cursor), for an exact resume."""
        if self.rollouts is None:
            return None
        rollouts, refill, curriculum = self.rollouts, self.refill, self.curriculum
        inner = rollouts.state if refill is None else lambda: packed_state(rollouts.state(), refill)
        return inner if curriculum is None else lambda: cur.packed_state(inner(), curriculum)

    def close(self) -> None:
        """Release what sampling holds."""
        if self.rollouts is not None:
            self.rollouts.close()
        if self.distiller is not None:
            self.distiller.teacher.close()

    def figures(self, device: torch.device, *, world_size: int, units: float) -> dict[str, float]:
        """:meth:`take_figures`."""
        return self.take_figures(device, world_size)

    # -- the rollout ------------------------------------------------------------------------------------

    def rollout(
        self, model: torch.nn.Module, batches: Sequence[PromptBatch], sampled: Sequence[Completions], *, step: int,
        precision: Precision | None = None,
    ) -> list[RolloutBatch]:  # fmt: skip
        """Score each micro-batch's sampled completions (with dynamic sampling: keep the informative groups,
        sampling more prompts for them) and turn them into micro-batches to train on."""
        inner = transformers_model(model)
        scored = [self.scored(batch, completions, step) for batch, completions in zip(batches, sampled, strict=True)]
        carrier = False
        if self.curriculum is not None:  # the step's own prompts, before dynamic sampling drops any
            first = self.rewards.names[0]
            self.curriculum.observe([(p.batch, cur.solved_flags(p.scores.by_function[first])) for p in scored], step)
        if self.refill is not None:
            scored, carrier = self.informative(inner, scored, step, len(batches[0].prompts))
        out = []
        for piece in scored:
            version = step - 1 if piece.completions.version is None else piece.completions.version
            out += self.to_rollout(inner, piece.batch, piece.completions, piece.rewards, precision,
                                   stale=staleness(step, version) > 0)  # fmt: skip
        for batch in out if carrier else []:
            batch.terms, batch.weight = 0, 0.0
        return out

    def scored(self, batch: PromptBatch, completions: Completions, step: int) -> Scored:
        """A micro-batch's completions scored, their rewards shaped (overlong punishment), the figures added."""
        import torch

        references = [ref for ref in batch.references for _ in range(self.settings.group_size)]
        scores = self.rewards.score(completions.texts, references, batch.rows_of_completions(self.settings.group_size))
        if completions.episodes is not None:
            scores = episode_scores(scores, completions.episodes)
            self.add_episodes(completions)
        s = self.settings
        rewards = shaped_rewards(scores.total, completions.token_ids, max_new_tokens=s.max_new_tokens,
                                 buffer=s.overlong_buffer, factor=s.overlong_penalty)  # fmt: skip
        self.add_scores(scores, torch.tensor(rewards, dtype=torch.float32), completions)
        self.add("overlong_penalty", sum(rewards) - sum(scores.total))
        version = step - 1 if completions.version is None else completions.version
        self.add("time/rollout_generate_s", completions.seconds)
        self.add("rollout_tokens", float(completions.generated_tokens))
        self.add("staleness", float(staleness(step, version)))
        self.add("rollout_batches", 1.0)
        return Scored(batch, completions, scores, rewards)

    def informative(
        self, inner: TransformersModel, scored: list[Scored], step: int, micro_batch: int
    ) -> tuple[list[Scored], bool]:
        """Dynamic sampling (:func:`~rayft.training.methods.rl.dynamic_sampling.refilled`), its record added."""
        assert self.refill is not None and self.settings.dynamic_sampling is not None

        def sample(units: list[Unit], round_: int) -> Scored:
            batch = self.collate(units)
            seed = refill_seed(self.seed, step, round_, batch.sample_ids[0])
            group = self.settings.group_size
            episodes = self.rollouts.episodes if isinstance(self.rollouts, ColocatedRollouts) else None
            if episodes is not None:  # the refill's prompts run as episodes too, as the step's others did
                sampled = episodes.run(inner, batch.prompts, batch.rows, group, seed)
            else:
                sampled = self.sampler.sample(inner, batch.prompts, group, seed=seed)
            sampled.version = step - 1
            return self.scored(batch, sampled, step)

        settings = self.settings.dynamic_sampling
        kept, carrier, record = refilled(scored, self.refill, settings, group=self.settings.group_size,
                                         micro_batch=micro_batch, sample=sample)  # fmt: skip
        for name, value in asdict(record).items():
            self.add(name, float(value))
        return kept, carrier

    @property
    def sampler(self) -> Sampler:
        """The sampler of rollouts and of greedy validation."""
        return Sampler(self.settings, self.lm.tokenizer, self.lm.plan.model.attn_implementation)

    @property
    def pad_id(self) -> int:
        """The padding token of the training rows."""
        return self.sampler.pad_id

    def to_rollout(
        self, inner: TransformersModel, batch: PromptBatch, sampled: Completions, rewards: Sequence[float],
        precision: Precision | None, *, stale: bool = False,
    ) -> list[RolloutBatch]:  # fmt: skip
        """The completions as training micro-batches of at most ``train.rl.completions_per_forward`` rows, with
        their advantages from ``rewards`` (over each whole group; REINFORCE++'s over the micro-batch's
        tokens) and, for a ``stale`` rollout, the sampling weights' log-probabilities; with
        ``train.rl.mask_truncated``, a truncated completion's tokens are out of the loss."""
        import torch

        g, s = self.settings.group_size, self.settings
        # REINFORCE++ weighs a completion by its trained tokens: an episode's environment answers are not.
        trained_counts = ([len(ids) for ids in sampled.token_ids] if sampled.masks is None
                          else [sum(mask) for mask in sampled.masks])  # fmt: skip
        lengths = torch.tensor(trained_counts, dtype=torch.float32)
        advantages = group_advantages(torch.tensor(rewards, dtype=torch.float32), g, baseline=s.advantage,
                                      scale=s.scale_rewards, lengths=lengths)  # fmt: skip
        if s.distillation is not None and s.distillation.mode == "replace":
            advantages = torch.zeros_like(advantages)  # the teacher's term is the whole signal
        cut = truncated(sampled.token_ids, self.sampler.eos_ids)
        self.add("truncated", float(sum(cut)))
        units = []
        for index, completion in enumerate(sampled.token_ids):
            prompt = batch.prompts[index // g]
            ids = prompt + completion
            # Only sampled tokens are trained: an episode's environment answers (mask 0) are context.
            trained = completion if sampled.masks is None else masked(completion, sampled.masks[index])
            dropped = s.mask_truncated and cut[index]
            labels = [IGNORE_INDEX] * len(ids) if dropped else [IGNORE_INDEX] * len(prompt) + trained
            units.append({"input_ids": ids, "labels": labels, "position_ids": range(len(ids)),
                          "sample_ids": [batch.sample_ids[index // g]] if index % g == 0 else []})  # fmt: skip
        size = self.settings.completions_per_forward or g
        behaviour = sampled.logps if stale else None
        return [self.training_batch(inner, units[i : i + size], advantages[i : i + size], precision,
                                    None if behaviour is None else behaviour[i : i + size])
                for i in range(0, len(units), size)]  # fmt: skip

    def training_batch(
        self, inner: TransformersModel, units: list[Unit], advantages: torch.Tensor, precision: Precision | None,
        behaviour: list[list[float]] | None = None,
    ) -> RolloutBatch:  # fmt: skip
        """Completion rows as one padded micro-batch (laid end to end for the forward passes with
        ``train.padding_free``), with their reference log-probabilities if the KL term
        needs them, the rollout policy's if the rollout is trained on more than once, and the sampling
        weights' (``behaviour``, per completion token) of a stale rollout."""
        import torch

        plan = self.lm.plan
        rows = collate(units, self.pad_id, row_multiple(plan.model.attn_implementation),
                       packed=plan.train.padding_free is True)  # fmt: skip
        ref = self.reference_logps(inner, rows) if self.reference_kind != "none" else None
        old = None
        if self.settings.steps_per_rollout > 1:
            with torch.no_grad():
                old = self.logps(inner, rows.to(next(inner.parameters()).device), precision)[0]
        tokens = sum(len(u["input_ids"]) - u["labels"].count(IGNORE_INDEX) for u in units)
        terms = tokens if POLICY_LOSSES[self.settings.loss].token_terms else len(units)
        sampling = None if behaviour is None else behaviour_rows(units, behaviour, rows)
        teacher = None
        if self.distiller is not None:
            teacher = self.distiller.teacher_logps(units, rows, next(inner.parameters()).device, self.sums)
        return RolloutBatch(rows, advantages, ref, terms, old, sampling, teacher_logps=teacher)

    def reference_logps(self, inner: TransformersModel, rows: MicroBatch) -> torch.Tensor:
        """The reference model's per-token log-probabilities of the completions (the policy's layout)."""
        import torch

        kind = self.reference_kind
        with torch.no_grad():
            if kind == "copy":
                assert self.reference_model is not None
                return self.logps(self.reference_model.to(rows.input_ids.device), rows, None)[0]
            if kind == "base":
                check_adapter_off_is_base(inner, "GRPO's KL reference (train.rl.reference base)")
            disabled = cast("PeftModel", inner).disable_adapter() if kind == "base" else contextlib.nullcontext()
            with disabled:
                return self.logps(inner, rows, None)[0]

    def logps(
        self, model: torch.nn.Module, rows: MicroBatch, precision: Precision | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-token log-probabilities and entropies of the rows' completion tokens, and their mask
        (:func:`~rayft.training.methods.rl.losses.completion_logps`)."""
        return completion_logps(model, rows, precision.autocast_dtype if precision is not None else None)

    # -- the loss and the figures -------------------------------------------------------------------------

    def loss_sum(self, model: torch.nn.Module, batch: TrainBatch, precision: Precision) -> torch.Tensor:
        """The sum of the batch's loss terms under ``train.rl.loss``."""
        assert isinstance(batch, RolloutBatch)  # the loop trains on what rollout() made
        logps, entropy, mask = self.logps(model, batch.rows, precision)
        # One update per rollout: the samples are the policy's own, the ratio 1 with its gradient.
        old = logps.detach() if batch.old_logps is None else batch.old_logps
        weights = self.behaviour_weights(batch, old, mask)
        result = policy_loss(logps, old, batch.ref_logps, batch.advantages, mask, self.loss_settings, weights)
        self.add("kl", result.kl_sum)
        self.add("clip_low", result.low_clipped)
        self.add("clip_high", result.high_clipped)
        self.add("entropy", float(entropy.sum()))
        self.add("loss_tokens", result.tokens)
        loss = result.loss_sum
        if self.distiller is not None and batch.teacher_logps is not None:
            distilled = distillation_loss(logps, old, batch.teacher_logps, mask, self.loss_settings,
                                          self.distiller.config.coefficient, weights)  # fmt: skip
            self.add("distill/reverse_kl", distilled.reverse_kl_sum)
            self.add("distill/tokens", distilled.tokens)
            loss = loss + distilled.loss_sum
        return loss * batch.weight if batch.weight != 1.0 else loss

    def behaviour_weights(self, batch: RolloutBatch, proximal: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """The truncated importance weights of a stale rollout's tokens (``train.rl.rollout.importance_cap``),
        or None where the rollout's sampling weights are the step's own; their figures are added up."""
        cap = self.settings.rollout.importance_cap
        if batch.behaviour_logps is None or cap is None:
            return None
        # The batch is on the model's device (RolloutBatch.to): its rows' labels and its behaviour log-probabilities.
        behaviour = batch.behaviour_logps[:, kept_positions(batch.rows.labels)]
        weights = importance_weights(proximal, behaviour, mask, cap)
        self.add("importance_weight", float((weights * mask).sum()))
        self.add("importance_capped", float(((weights >= cap) & mask).sum()))
        self.add("importance_tokens", float(mask.sum()))
        return weights

    def add(self, name: str, value: float) -> None:
        """Add ``value`` to this rank's sum of ``name`` since the last figures."""
        self.sums[name] = self.sums.get(name, 0.0) + value

    def add_scores(self, scores: Scores, rewards: torch.Tensor, sampled: Completions) -> None:
        """The rollout's reward figures: totals, each function's, errors, pass rates, group spread (of the shaped
        ``rewards`` the advantages see), lengths."""
        g = self.settings.group_size
        grouped = rewards.view(-1, g)
        names = self.rewards.names  # none when a teacher alone trains (train.rl.distillation)
        solved = [value >= 1.0 for value in scores.by_function[names[0]]] if names else [False] * len(scores.total)
        self.add("completions", float(len(scores.total)))
        self.add("groups", float(grouped.shape[0]))
        self.add("reward", sum(scores.total))  # the functions' total; the overlong punishment has its own figure
        self.add("reward_std", float(unbiased_std(grouped, dim=1).sum()))
        self.add("zero_std_groups", float((grouped.max(dim=1).values == grouped.min(dim=1).values).sum()))
        self.add("pass@1", float(sum(solved)))
        self.add("pass@k", float(sum(any(solved[i : i + g]) for i in range(0, len(solved), g))))
        self.add("completion_length", float(sampled.generated_tokens))
        # The basis of a curriculum: prompts every completion solved, and those none did.
        self.add("prompts_all_solved", float(sum(all(solved[i : i + g]) for i in range(0, len(solved), g))))
        self.add("prompts_none_solved", float(sum(not any(solved[i : i + g]) for i in range(0, len(solved), g))))
        for name in self.rewards.names:
            self.add(f"reward/{name}", sum(scores.by_function[name]))
            self.add(f"reward_errors/{name}", float(scores.errors[name]))

    def figure_names(self) -> list[str]:
        """Every sum :meth:`take_figures` reduces, in one order on every rank."""
        fixed = ["completions", "groups", "reward", "reward_std", "zero_std_groups", "pass@1", "pass@k",
                 "completion_length", "kl", "clip_low", "clip_high", "entropy", "loss_tokens", "rollout_tokens",
                 "time/rollout_generate_s", "staleness", "rollout_batches", "importance_weight", "importance_capped",
                 "importance_tokens", "prompts_all_solved", "prompts_none_solved", "truncated", "overlong_penalty",
                 *RECORD_FIGURES, *cur.FIGURES]  # fmt: skip
        rewards = [f"reward/{n}" for n in self.rewards.names] + [f"reward_errors/{n}" for n in self.rewards.names]
        episodes = episode_figure_names(self.tool_names) if self.settings.environment is not None else []
        distilled = list(DISTILL_SUMS) if self.settings.distillation is not None else []
        return fixed + rewards + episodes + distilled

    @property
    def tool_names(self) -> list[str]:
        """The tools whose calls the figures count apart (read from the environment once)."""
        if self.counted_tools is None:
            self.counted_tools = tool_names(self.settings.environment)
        return self.counted_tools

    def add_episodes(self, completions: Completions) -> None:
        """A multi-turn rollout's episode figures: turns, tool calls, errors, timeouts, cuts, tokens, seconds."""
        assert completions.episodes is not None
        for name, value in episode_sums(completions.episodes, self.tool_names).items():
            self.add(name, value)
        self.add("time/rollout_sample_s", completions.seconds)
        self.add("time/rollout_tools_s", completions.tool_seconds)
        self.parts["rollout_sample"] = self.parts.get("rollout_sample", 0.0) + completions.seconds
        self.parts["rollout_tools"] = self.parts.get("rollout_tools", 0.0) + completions.tool_seconds

    def phase_parts(self) -> dict[str, float]:
        """The last rollout's seconds of sampling and of the environment's steps (episodes only; on generation
        actors, theirs), within the step's ``rollout`` phase."""
        parts, self.parts = self.parts, {}
        return parts

    def take_figures(self, device: torch.device, world_size: int) -> dict[str, float]:
        """The figures since the last call over every rank (rl/*), and reset: means per completion, per
        group or per completion token; counts of reward errors; rollout tokens per second of generation."""
        names = self.figure_names()
        if self.curriculum is not None:
            self.curriculum.take_sums(self.sums)
        total = dict(zip(names, all_reduce_sum([self.sums.get(n, 0.0) for n in names], device), strict=True))
        self.sums.clear()
        completions, groups = max(total["completions"], 1.0), max(total["groups"], 1.0)
        tokens = max(total["loss_tokens"], 1.0)
        figures = {
            "rl/reward": total["reward"] / completions,
            "rl/reward_std": total["reward_std"] / groups,
            "rl/zero_std_groups": total["zero_std_groups"] / groups,
            "rl/pass@1": total["pass@1"] / completions,
            f"rl/pass@{self.settings.group_size}": total["pass@k"] / groups,
            "rl/completion_length": total["completion_length"] / completions,
            "rl/entropy": total["entropy"] / tokens,
            "rl/clip_fraction": (total["clip_low"] + total["clip_high"]) / tokens,
            "rl/staleness": total["staleness"] / max(total["rollout_batches"], 1.0),
            # Generation runs on every rank at once: tokens of all ranks over one rank's mean generating time.
            "rl/rollout_tokens_per_s": total["rollout_tokens"]
            / max(total["time/rollout_generate_s"] / world_size, 1e-9),
        }
        if self.settings.kl_coef:
            figures["rl/kl"] = total["kl"] / tokens
        figures.update(record_figures(total, completions, self.settings))
        if self.settings.curriculum is not None:
            figures.update(cur.figures(total))
        rollout = self.settings.rollout
        if rollout.max_staleness and rollout.importance_cap is not None:
            # Over the tokens of stale rollouts only (none: the weights are 1).
            weighed = total["importance_tokens"]
            figures["rl/importance_weight"] = total["importance_weight"] / weighed if weighed else 1.0
            figures["rl/importance_capped"] = total["importance_capped"] / max(weighed, 1.0)
        for name in self.rewards.names:
            figures[f"rl/reward/{name}"] = total[f"reward/{name}"] / completions
            figures[f"rl/reward_errors/{name}"] = total[f"reward_errors/{name}"]
        if self.settings.environment is not None:
            figures.update(episode_figures(total, self.tool_names, world_size))
        if self.settings.distillation is not None:
            figures.update(distill_figures(total, world_size))
        if not self.rewards.functions:  # a teacher alone trains: there is no reward to report
            figures = {k: v for k, v in figures.items() if not k.startswith(("rl/reward", "rl/pass@", "rl/zero_std"))}
        return figures

    # -- evaluation ---------------------------------------------------------------------------------------

    def evaluate(
        self, model: torch.nn.Module, units: Iterable[Unit], *, batch_size: int, precision: Precision,
        device: torch.device, lockstep: bool,
    ) -> dict[str, float]:  # fmt: skip
        """Greedy completions of every worker's validation prompts, scored: ``eval/reward`` (and each
        function's), ``eval/pass@1``, and ``eval/loss`` = minus the mean reward, which ranks checkpoints."""
        inner = transformers_model(model)
        if not self.rewards.functions:  # a teacher alone trains: checkpoints rank by the reverse KL to it
            with self.whole(model):
                return self.evaluate_distillation(inner, units, batch_size, device)
        names = self.rewards.names
        sums = [0.0] * (len(names) + 3)  # total reward, each function's, solved, completions
        with self.whole(model):  # each worker decodes its own prompts: no collective in between
            self.evaluate_units(inner, units, batch_size, sums)
        totals = all_reduce_sum(sums, device)
        count = max(totals[-1], 1.0)
        figures = {"eval/loss": -totals[0] / count, "eval/reward": totals[0] / count, "eval/pass@1": totals[-2] / count}
        figures.update({f"eval/reward/{name}": totals[i + 1] / count for i, name in enumerate(names)})
        return figures

    def evaluate_units(
        self, inner: TransformersModel, units: Iterable[Unit], batch_size: int, sums: list[float]
    ) -> None:
        """Add to ``sums`` the greedy completions' scores of ``units``: the total reward, each function's, the
        solved completions and the completions."""
        names = self.rewards.names
        for chunk in micro_batches(iter(units), batch_size):
            batch = self.collate(chunk)
            sampled = self.sampler.sample(inner, batch.prompts, 1, seed=None)
            scores = self.rewards.score(sampled.texts, batch.references, batch.rows_of_completions(1))
            sums[0] += sum(scores.total)
            for index, name in enumerate(names):
                sums[index + 1] += sum(scores.by_function[name])
            sums[-2] += sum(value >= 1.0 for value in scores.by_function[names[0]])
            sums[-1] += len(scores.total)

    def evaluate_distillation(
        self, inner: TransformersModel, units: Iterable[Unit], batch_size: int, device: torch.device
    ) -> dict[str, float]:
        """``eval/distill/reverse_kl`` (also ``eval/loss``): the per-token reverse KL to the teacher on one
        completion of every validation prompt, sampled from the run's seed."""
        assert self.distiller is not None  # the config allows no rewards only with distillation
        sums = [0.0, 0.0]
        for index, chunk in enumerate(micro_batches(iter(units), batch_size)):
            prompts = self.collate(chunk).prompts
            gap, tokens = sampled_reverse_kl(inner, self.sampler, self.distiller.teacher, prompts, self.seed + index)
            sums = [sums[0] + gap, sums[1] + tokens]
        gap, tokens = all_reduce_sum(sums, device)
        value = gap / max(tokens, 1.0)
        return {"eval/loss": value, "eval/distill/reverse_kl": value}
