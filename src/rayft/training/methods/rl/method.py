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

The step's micro-batches are shaped in :mod:`rayft.training.methods.rl.batches`, its figures kept in
:mod:`rayft.training.methods.rl.figures`, and the held-out scoring is :mod:`rayft.training.methods.rl.evaluation`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rayft.config.rl import RlConfig
from rayft.data.collate import MicroBatch, collate
from rayft.data.prepared import IGNORE_INDEX
from rayft.errors import ConfigError
from rayft.evaluation.rewards import RewardSet
from rayft.training.loop.batches import Batch, TrainBatch, Unit
from rayft.training.loop.method import MethodHooks
from rayft.training.loop.objective import CausalLm
from rayft.training.loop.session import TrainSession, all_reduce_sum
from rayft.training.methods.rl import curriculum as cur
from rayft.training.methods.rl.batches import (
    RolloutBatch,
    behaviour_rows,
    completion_units,
    prompt_batch,
    trained_counts,
)
from rayft.training.methods.rl.distill import Distiller, build_teacher, distillation_loss
from rayft.training.methods.rl.dynamic_sampling import (
    RefillStream,
    Scored,
    packed_state,
    refill_seed,
    refilled,
    unpacked_state,
)
from rayft.training.methods.rl.episodes import episode_scores
from rayft.training.methods.rl.evaluation import distillation_figures, reward_figures, reward_sums
from rayft.training.methods.rl.figures import RlRecord
from rayft.training.methods.rl.losses import (
    POLICY_LOSSES,
    PolicyLossSettings,
    completion_logps,
    group_advantages,
    importance_weights,
    kept_positions,
    policy_loss,
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
class RlTraining(MethodHooks):
    """The :class:`~rayft.training.loop.method.Method` of GRPO and its variants: the model, its files
    and checkpoints are :class:`~rayft.training.loop.objective.CausalLm`'s (LoRA or full); a step's batches
    are prompts, from which it samples and scores rollouts to train on with the clipped policy loss."""

    lm: CausalLm
    settings: RlConfig
    rewards: RewardSet
    seed: int
    record: RlRecord  # this rank's figure sums since the last figures
    reference_model: torch.nn.Module | None = None
    throughput_unit: str = "tokens"
    rollouts: Rollouts | None = None  # where the worker's rollouts are sampled, from start() on
    saved_ahead: str | None = None  # the rollouts sampled ahead at the checkpoint the run resumes from
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
        return cls(lm, settings, rewards, seed, RlRecord(settings, rewards.names))

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
        carried = self.rewards.reads_rows or (self.settings.environment is not None and self.settings.carried_columns)
        return prompt_batch(units, self.lm.tokenizer, carried=bool(carried))

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
        """The figures since the last call over every rank (rl/*: :meth:`~rayft.training.methods.rl.figures.
        RlRecord.take`), and reset."""
        return self.record.take(device, world_size, self.curriculum)

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
            self.record.add_episodes(completions)
        s = self.settings
        rewards = shaped_rewards(scores.total, completions.token_ids, max_new_tokens=s.max_new_tokens,
                                 buffer=s.overlong_buffer, factor=s.overlong_penalty)  # fmt: skip
        self.record.add_scores(scores, torch.tensor(rewards, dtype=torch.float32), completions)
        self.record.add("overlong_penalty", sum(rewards) - sum(scores.total))
        version = step - 1 if completions.version is None else completions.version
        self.record.add("time/rollout_generate_s", completions.seconds)
        self.record.add("rollout_tokens", float(completions.generated_tokens))
        self.record.add("staleness", float(staleness(step, version)))
        self.record.add("rollout_batches", 1.0)
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
            self.record.add(name, float(value))
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
        lengths = torch.tensor(trained_counts(sampled), dtype=torch.float32)
        advantages = group_advantages(torch.tensor(rewards, dtype=torch.float32), g, baseline=s.advantage,
                                      scale=s.scale_rewards, lengths=lengths)  # fmt: skip
        if s.distillation is not None and s.distillation.mode == "replace":
            advantages = torch.zeros_like(advantages)  # the teacher's term is the whole signal
        cut = truncated(sampled.token_ids, self.sampler.eos_ids)
        self.record.add("truncated", float(sum(cut)))
        units = completion_units(batch, sampled, cut, group=g, mask_truncated=s.mask_truncated)
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
            teacher = self.distiller.teacher_logps(units, rows, next(inner.parameters()).device, self.record.sums)
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
        self.record.add("kl", result.kl_sum)
        self.record.add("clip_low", result.low_clipped)
        self.record.add("clip_high", result.high_clipped)
        self.record.add("entropy", float(entropy.sum()))
        self.record.add("loss_tokens", result.tokens)
        loss = result.loss_sum
        if self.distiller is not None and batch.teacher_logps is not None:
            distilled = distillation_loss(logps, old, batch.teacher_logps, mask, self.loss_settings,
                                          self.distiller.config.coefficient, weights)  # fmt: skip
            self.record.add("distill/reverse_kl", distilled.reverse_kl_sum)
            self.record.add("distill/tokens", distilled.tokens)
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
        self.record.add("importance_weight", float((weights * mask).sum()))
        self.record.add("importance_capped", float(((weights >= cap) & mask).sum()))
        self.record.add("importance_tokens", float(mask.sum()))
        return weights

    def phase_parts(self) -> dict[str, float]:
        """The last rollout's seconds of sampling and of the environment's steps (episodes only; on generation
        actors, theirs), within the step's ``rollout`` phase."""
        return self.record.take_parts()

    # -- evaluation ---------------------------------------------------------------------------------------

    def evaluate(
        self, model: torch.nn.Module, units: Iterable[Unit], *, batch_size: int, precision: Precision,
        device: torch.device, lockstep: bool,
    ) -> dict[str, float]:  # fmt: skip
        """Greedy completions of every worker's validation prompts, scored: ``eval/reward`` (and each
        function's), ``eval/pass@1``, and ``eval/loss`` = minus the mean reward, which ranks checkpoints
        (:mod:`rayft.training.methods.rl.evaluation`)."""
        inner = transformers_model(model)
        with self.whole(model):  # each worker decodes its own prompts: no collective in between
            if not self.rewards.functions:  # a teacher alone trains: checkpoints rank by the reverse KL to it
                return distillation_figures(inner, units, batch_size=batch_size, device=device, collate=self.collate,
                                            sampler=self.sampler, distiller=self.distiller, seed=self.seed)  # fmt: skip
            sums = reward_sums(inner, units, batch_size=batch_size, collate=self.collate, sampler=self.sampler,
                               rewards=self.rewards)  # fmt: skip
        return reward_figures(all_reduce_sum(sums, device), self.rewards.names)
