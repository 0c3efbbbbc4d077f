"""Config section of online reinforcement learning against verifiers (``train.objective: grpo``): the
group of samples per prompt, how they are generated, the rewards that score them, and the loss."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rayft.config.base import Section
from rayft.config.environment import EnvironmentConfig
from rayft.config.generation import EndpointConfig
from rayft.config.judge import JudgeConfig
from rayft.config.reward_model import RewardModelConfig
from rayft.config.sdg import SdgDecontaminationConfig

MAX_GROUP_SIZE = 1024
"""Largest ``train.rl.group_size``: published GRPO runs sample 4 to 64 completions per prompt; thousands
only make a step hold gigabytes of KV cache for group statistics that stopped changing long before."""

BUILTIN_REWARDS = ("math", "exact_match", "regex", "length", "sql", "code", "judge", "reward_model")
"""Reward functions rayft ships (``train.rl.rewards[].function``); anything else is ``package.module:function``."""


class RewardConfig(Section):
    """One reward function and its weight in a sample's total reward."""

    function: str = Field(
        ...,
        description=(
            "'math' (1 when the number the completion ends on, read with the GSM8K extraction, equals the "
            "reference's final number), 'exact_match' (1 when the normalised completion equals the reference), "
            "'regex' (1 when the completion matches `pattern`: a format reward), 'length' (1 minus the "
            "completion's share of rl.max_new_tokens: a brevity reward), 'sql' (execution accuracy: 1 when the "
            "completion, run as a query on the row's own table in the read-only SQLite sandbox eval's sql task uses, "
            "gives the reference query's result; 0 for another result or a query that does not run; the table is "
            "the row's `table_column`, JSON with name, header, types, rows), 'code' (the completion's last ```python "
            "block, run in rayft's process sandbox against the row's tests in `tests_column`, a list of Python "
            "statements such as 'assert f(2) == 4': the share that pass, or 1/0 with code_scoring=all), 'judge' (an "
            "LLM judge behind an OpenAI-compatible endpoint scores the completion against a rubric, see `judge`), "
            "'reward_model' (a sequence classifier's score of the row's prompt and the completion, such as the "
            "final/ directory of a train.objective=reward_model run, see `reward_model`), or "
            "'package.module:function', called "
            "as fn(completion: str, reference: str) -> float, or, when the function has a parameter named `row`, "
            "as fn(completion, reference, row=...) with row the dict of the row's columns listed in "
            "train.rl.row_columns. The reference is the row's response (the answer the data holds for the prompt)."
        ),
    )
    weight: float = Field(1.0, description="Factor of this function's reward in the sample's total reward.")
    pattern: str | None = Field(
        None,
        description="For function 'regex': the regular expression (Python re.search, DOTALL) a completion must match.",
    )
    table_column: str | None = Field(
        None,
        description=(
            "For function 'sql': the data column holding each row's table (JSON text or object: name, header, "
            "types, rows), carried with its prompt to the reward. Unset: 'table' (the column of builtin:sql)."
        ),
    )
    tests_column: str | None = Field(
        None,
        description=(
            "For function 'code': the data column holding each row's tests (a list of Python statements, or JSON "
            "text of one), carried with its prompt to the reward. Unset: 'tests'."
        ),
    )
    code_scoring: Literal["fraction", "all"] = Field(
        "fraction",
        description="For function 'code': the reward is the share of tests that pass ('fraction') or 1 only when "
        "every test passes ('all').",
    )
    judge: JudgeConfig | None = Field(
        None, description="For function 'judge': the judge model, its endpoint, the rubric and how its score is read."
    )
    reward_model: RewardModelConfig | None = Field(
        None,
        description="For function 'reward_model': the classifier (path), the prompt column, the normalisation.",
    )
    name: str | None = Field(
        None, description="The name its figures are logged under (rl/reward/<name>); default: the function."
    )

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value, re.DOTALL)
            except re.error as exc:
                raise ValueError(
                    f"not a regular expression ({exc}); fix it (Python re syntax: a literal ( [ {{ . * + ? is "
                    "escaped with a backslash)"
                ) from None
        return value

    @model_validator(mode="after")
    def _pattern_for_regex(self) -> RewardConfig:
        if self.function != "sql" and self.table_column is not None:
            raise ValueError(
                f"table_column is set for reward function {self.function!r}; table_column is only read by 'sql'"
            )
        if self.function != "code" and (self.tests_column is not None or self.code_scoring != "fraction"):
            raise ValueError(
                f"tests_column or code_scoring is set for reward function {self.function!r}; they are only read "
                "by 'code'"
            )
        if self.function == "regex" and not self.pattern:
            raise ValueError("reward function 'regex' needs a pattern; set pattern: '<regular expression>'")
        if self.function != "regex" and self.pattern is not None:
            raise ValueError(f"pattern is set for reward function {self.function!r}; pattern is only read by 'regex'")
        if (self.function == "judge") != (self.judge is not None):
            raise ValueError(
                "reward function 'judge' needs a judge section (judge: {model: ..., endpoint: {base_url: ...}}), and "
                f"only 'judge' reads one (function is {self.function!r})"
            )
        if (self.function == "reward_model") != (self.reward_model is not None):
            raise ValueError(
                "reward function 'reward_model' needs a reward_model section (reward_model: {path: <directory or Hub "
                f"id>}}), and only 'reward_model' reads one (function is {self.function!r})"
            )
        if self.function not in BUILTIN_REWARDS and ":" not in self.function:
            raise ValueError(
                f"reward function {self.function!r} is neither built in ({', '.join(BUILTIN_REWARDS)}) nor "
                "'package.module:function'; name one of those"
            )
        return self

    @property
    def label(self) -> str:
        """The name under which its reward is logged."""
        return self.name or self.function.rsplit(":", 1)[-1]

    @property
    def columns(self) -> tuple[str, ...]:
        """The data columns this built-in function reads beside the completion and the reference."""
        if self.function == "code":
            return (self.tests_column or "tests",)
        if self.judge is not None:
            return (self.judge.prompt_column,)
        if self.reward_model is not None:
            return (self.reward_model.prompt_column,)
        return (self.table_column or "table",) if self.function == "sql" else ()


class RolloutConfig(Section):
    """Where the rollouts of ``train.objective: grpo`` are sampled: on the training workers themselves
    (colocated), or on Ray generation actors apart from them, which receive the policy's weights after every
    step and may sample ahead of training (bounded staleness)."""

    placement: Literal["colocated", "actors"] = Field(
        "colocated",
        description=(
            "'colocated': each training worker samples with Hugging Face generate on the model it trains (no "
            "weights travel). 'actors': Ray generation actors apart from the trainer hold a copy of the policy, "
            "receive its weights through the Ray object store after each step (LoRA: the adapter tensors only; "
            "full: the whole state dict) and sample the rollouts (HF generate, or vLLM on GPUs)."
        ),
    )
    num_actors: int | None = Field(
        None,
        ge=1,
        description=(
            "Generation actors in total (placement 'actors'), split evenly among the training workers: each "
            "worker owns at least one and sends its micro-batches of prompts to its own, round robin. Unset: one "
            "per training worker."
        ),
    )
    num_cpus_per_actor: float = Field(
        1.0, ge=0, description="CPUs Ray reserves for each generation actor (HF generate uses that many threads)."
    )
    num_gpus_per_actor: float = Field(
        0.0,
        ge=0,
        description="GPUs Ray reserves for each generation actor; > 0 puts its model on the GPU (engine 'auto': vLLM).",
    )
    engine: Literal["auto", "hf", "vllm"] = Field(
        "auto",
        description=(
            "What the actors generate with: 'hf' (Hugging Face generate, seeded exactly as colocated sampling), "
            "'vllm' (a vLLM engine on the actor's GPU: pip install 'rayft[vllm]'; its sampling is seeded per "
            "completion, so its samples are not the colocated ones), 'auto' (vllm with num_gpus_per_actor > 0, "
            "else hf)."
        ),
    )
    shared_prefix: bool = Field(
        True,
        description=(
            "Hugging Face sampling (colocated and 'hf' actors): each prompt of a micro-batch is prefilled once and "
            "its KV cache copied to its group_size completions, instead of prefilling it group_size times. The "
            "same tokens and sampling distribution up to float rounding, with less prefill work; false prefills every "
            "completion's copy. vLLM actors are unaffected (vLLM manages its own cache)."
        ),
    )
    actor_class: str | None = Field(
        None,
        description=(
            "A generation actor class of your own, 'package.module:Class', in place of the engine's: constructed "
            "with the actor spec (rayft.training.methods.rl.rollout_actors.ActorSpec) and answering ready(), "
            "load_weights(update) and generate(prompts, group, seed) as rayft's HfRolloutActor does."
        ),
    )
    start_timeout_s: float = Field(
        600.0,
        gt=0,
        description=(
            "Longest wait, in seconds, for the actors to be placed and to load the model; past it the run ends "
            "(the cluster lacks the actors' CPUs or GPUs, or the model loads too slowly)."
        ),
    )
    sync_timeout_s: float = Field(
        300.0,
        gt=0,
        description=(
            "Longest wait, in seconds, for a weight synchronisation to the actors to finish; past it the run ends "
            "with the actor named (a large model over a slow network, or an actor that hangs)."
        ),
    )
    generate_timeout_s: float = Field(
        1800.0,
        gt=0,
        description=(
            "Longest wait, in seconds, for an actor's rollout of one micro-batch of prompts, counted once its "
            "weights are synchronised; past it the run ends (raise it for long completions on slow actors)."
        ),
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=4,
        description=(
            "How many optimizer steps older than the policy being trained a rollout's weights may be: 0 samples "
            "each step with the weights of the step before (synchronous); 1 lets the actors sample step n+1 while "
            "step n trains (asynchronous, one step off-policy). Needs placement 'actors'. Logged as rl/staleness."
        ),
    )
    importance_cap: float | None = Field(
        2.0,
        gt=0,
        description=(
            "With max_staleness > 0: the HF actors also return each completion token's log-probability under the "
            "weights that sampled it, and the loss of a rollout sampled with older weights than the step's is "
            "weighed per token by min(pi_step / pi_sampling, importance_cap) (truncated importance sampling, as "
            "decoupled PPO corrects stale rollouts); logged as rl/importance_weight and rl/importance_capped. "
            "Null: no correction (the clipped ratio alone, taken against the policy at the step's start)."
        ),
    )

    @model_validator(mode="after")
    def _actor_settings_need_actors(self) -> RolloutConfig:
        if self.placement == "colocated":
            if self.max_staleness:
                raise ValueError(
                    f"train.rl.rollout.max_staleness={self.max_staleness} needs placement 'actors': colocated "
                    "rollouts run on the trainer between its steps; set train.rl.rollout.placement=actors or "
                    "max_staleness=0"
                )
            if self.engine == "vllm" or self.actor_class is not None:
                what = "engine=vllm" if self.engine == "vllm" else "actor_class"
                raise ValueError(
                    f"train.rl.rollout.{what} is read by generation actors only; set train.rl.rollout.placement=actors"
                )
        if self.actor_class is not None and ":" not in self.actor_class:
            raise ValueError(
                f"train.rl.rollout.actor_class={self.actor_class!r} is not 'package.module:Class'; name the module "
                "and the class"
            )
        return self

    @property
    def resolved_engine(self) -> Literal["hf", "vllm"]:
        """The engine the actors run: 'auto' is vLLM on GPUs, HF generate on CPUs."""
        if self.engine != "auto":
            return self.engine
        return "vllm" if self.num_gpus_per_actor > 0 else "hf"


class DynamicSamplingConfig(Section):
    """DAPO's dynamic sampling: a step trains only on informative groups (completions of one prompt whose
    rewards differ) and samples more prompts until it holds as many as its prompts, within a bound."""

    max_rounds: int = Field(
        4,
        ge=1,
        le=64,
        description=(
            "Most extra sampling rounds per step on a worker; each draws prompts_per_round more prompts from the "
            "worker's shard (a second pass in an order of its own, its place kept in checkpoints), samples and "
            "scores them, and keeps their informative groups. A step still short after them trains on the "
            "informative groups it holds (counted in rl/short_steps)."
        ),
    )
    prompts_per_round: int | None = Field(
        None,
        ge=1,
        description=(
            "Prompts drawn in each extra round. Unset: the step's prompts on a worker (train.micro_batch_size x "
            "train.gradient_accumulation_steps), as DAPO draws another generation batch."
        ),
    )


class CurriculumConfig(Section):
    """A curriculum from SDG: after each step, a prompt every completion solved gets a harder variant (larger
    numbers) and a prompt none solved an easier one (smaller numbers), written by SDG's symbolic generator
    (the row's annotated solution re-computed with the new numbers, so the variant's answer is verified),
    checked against evaluation sets, queued, and served in later steps in place of some of their prompts."""

    harder: bool = Field(True, description="Make a harder variant of each prompt every completion solved.")
    easier: bool = Field(True, description="Make an easier variant of each prompt no completion solved.")
    harder_scale: int = Field(
        10,
        ge=2,
        le=1_000_000,
        description=(
            "A harder variant multiplies each varied number of the problem by this factor before drawing a new "
            "number near it (between half and twice the product), as sdg.operand_scale does."
        ),
    )
    easier_divisor: int = Field(
        10,
        ge=2,
        le=1_000_000,
        description=(
            "An easier variant divides each varied number of the problem by this before drawing near the quotient "
            "(never below 2; draws that make a division inexact or a result negative are redrawn)."
        ),
    )
    max_per_step: int = Field(
        4,
        ge=1,
        description=(
            "Most variants made per step on a worker, harder and easier together, in the order of the step's "
            "prompts; the solved or unsolved prompts past it are not varied."
        ),
    )
    serve_per_step: int = Field(
        1,
        ge=1,
        description=(
            "Most queued variants served per step on a worker: each takes the place of one of the step's last "
            "prompts (at most all of them; the data's own order is otherwise untouched)."
        ),
    )
    queue_size: int = Field(
        64,
        ge=1,
        description=(
            "Most variants waiting on a worker; when full, the oldest is dropped for a new one (counted in "
            "rl/curriculum/dropped). The queue is kept in checkpoints, so a resumed run serves what the "
            "uninterrupted run would."
        ),
    )
    max_attempts: int = Field(
        50, ge=1, description="Number draws per variant before giving up on it (counted in rl/curriculum/no_draw)."
    )
    decontamination: SdgDecontaminationConfig = Field(
        default_factory=SdgDecontaminationConfig,
        description=(
            "Evaluation sets no variant may leak into (word n-gram overlap with numbers masked, as sdg's "
            "decontamination checks); a variant that shares an n-gram with one is discarded and counted in "
            "rl/curriculum/leaked. No datasets: no check."
        ),
    )

    @model_validator(mode="after")
    def _one_kind(self) -> CurriculumConfig:
        if not (self.harder or self.easier):
            raise ValueError("harder and easier are both false, so no variant is ever made; enable one or unset "
                             "train.rl.curriculum")  # fmt: skip
        return self


class DistillationConfig(Section):
    """On-policy distillation: a teacher's log-probabilities of the student's own sampled tokens as the signal
    (the per-token reverse KL to the teacher, as Thinking Machines' on-policy distillation and TRL's GKD with
    lmbda 1 and beta 1 train on the student's samples)."""

    teacher: str = Field(
        ...,
        description=(
            "The teacher: a model directory or Hub id loaded on each training worker, frozen, with the student's "
            "model settings (dtype, attention); or, with endpoint set, the model name that endpoint serves. Its "
            "tokenizer must be the student's (the same tokens for the same ids): a mismatch is refused at start."
        ),
    )
    endpoint: EndpointConfig | None = Field(
        None,
        description=(
            "An OpenAI-compatible endpoint serving the teacher (rayft serve, vLLM): each completion's tokens are "
            "sent as token ids to /completions with echo, logprobs 0 and max_tokens 0, and the log-probabilities "
            "it returns for them are the teacher's. Unset: the teacher runs in process."
        ),
    )
    coefficient: float = Field(
        1.0,
        gt=0,
        description=(
            "Weight of the distillation term: each sampled token's advantage is coefficient x (log p_teacher - "
            "log p_student) of that token, trained with the clipped surrogate of train.rl.loss and normalised "
            "as its loss terms are."
        ),
    )
    mode: Literal["replace", "add"] = Field(
        "replace",
        description=(
            "'replace': the distillation term is the whole signal (the rewards, if any, are scored and logged "
            "only; set train.rl.rewards to [] to score none). 'add': it is added to the reward "
            "advantages of the configured rewards."
        ),
    )


class RlConfig(Section):
    """Group-relative policy optimisation (GRPO and its variants) with on-policy samples scored by rewards.

    Each training step takes its prompts from the training data (the rows' prompts; their responses are
    the references the rewards compare with), samples ``group_size`` completions per prompt with the
    current policy (on the training workers or on generation actors: ``rollout``), scores them, and
    trains on every completion with its advantage over the prompt's group."""

    group_size: int = Field(
        8,
        ge=2,
        le=MAX_GROUP_SIZE,
        description=(
            "Completions sampled per prompt (GRPO's G). Each prompt's completions are compared with each other, so "
            "a prompt whose completions all score the same teaches nothing; more samples make a difference likelier. "
            "A step samples train.micro_batch_size x group_size completions at once on each worker; a run whose "
            f"step would not fit a node's memory is refused before it starts, with the estimate. At most "
            f"{MAX_GROUP_SIZE}."
        ),
    )
    max_new_tokens: int = Field(128, gt=0, description="Longest completion sampled, in tokens.")
    completions_per_forward: int | None = Field(
        None,
        gt=0,
        description=(
            "Completions per training forward pass: a step's rollout (train.micro_batch_size prompts x group_size "
            "per worker) is trained in micro-batches of this many rows, which bounds activation memory; the "
            "update is the same whatever the split. Unset: group_size."
        ),
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the rollouts.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the rollouts (1: off).")
    loss: Literal["grpo", "dr_grpo", "dapo", "gspo", "cispo"] = Field(
        "dapo",
        description=(
            "The objective and how per-token losses become the step's loss: 'grpo' (the clipped surrogate, each "
            "completion's mean token loss averaged over completions: DeepSeekMath's), 'dr_grpo' (the token sum "
            "over completions times max_new_tokens: Dr. GRPO's, free of the length bias), 'dapo' (the mean over "
            "every completion token of the step: DAPO's token-level loss), 'gspo' (GSPO: one importance ratio per "
            "completion, the geometric mean of its tokens' ratios, clipped by epsilon/epsilon_high, which GSPO "
            "sets to about 3e-4/4e-4; averaged over completions), 'cispo' (CISPO: the importance weight clipped "
            "above at 1 + epsilon_high and without gradient, times the advantage and the token's log-probability, "
            "so no token loses its gradient; the token-level mean; ScaleRL caps the weight at about 5, epsilon_high "
            "4). Each equals TRL's: loss_type of the same name "
            "('gspo': loss_type grpo with importance_sampling_level sequence; 'cispo': TRL's epsilon_high is 1 + "
            "this epsilon_high)."
        ),
    )
    advantage: Literal["group", "rloo", "reinforce_pp", "reinforce_pp_baseline"] = Field(
        "group",
        description=(
            "How a completion's advantage is estimated from the rewards: 'group' (less the mean reward of its "
            "prompt's group, GRPO), 'rloo' (less the mean of the other completions of its prompt, RLOO's "
            "leave-one-out), 'reinforce_pp' (REINFORCE++: the reward whitened over every completion token of the "
            "micro-batch's rollout, no group baseline), 'reinforce_pp_baseline' (REINFORCE++-baseline: less the "
            "group mean, then whitened over the tokens), as OpenRLHF and verl define them; the REINFORCE++ "
            "estimators normalise themselves, so scale_rewards is not read with them."
        ),
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description=(
            "Divide advantages by the standard deviation of the group's rewards ('group', GRPO), of the worker's "
            "micro-batch rollout ('batch'), or not at all ('none', Dr. GRPO and RLOO). Not read by the "
            "REINFORCE++ estimators."
        ),
    )
    epsilon: float = Field(0.2, gt=0, lt=1, description="Lower clip range of the probability ratio (1 - epsilon).")
    epsilon_high: float | None = Field(
        None,
        gt=0,
        description="Upper clip range (1 + epsilon_high); DAPO's clip-higher uses 0.28. Unset: epsilon.",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description=(
            "Weight of the KL penalty toward the reference model (GRPO's beta; 0, the default as in DAPO and "
            "Dr. GRPO, computes no reference)."
        ),
    )
    reference: Literal["auto", "base", "copy"] = Field(
        "auto",
        description=(
            "The KL reference when kl_coef > 0: 'base' (the model with its LoRA adapter off, no second model), "
            "'copy' (a frozen copy of the starting weights loaded beside the policy), 'auto' (base for LoRA, copy "
            "for full fine-tuning)."
        ),
    )
    steps_per_rollout: int = Field(
        1,
        ge=1,
        description=(
            "Optimizer updates on each rollout (TRL's num_iterations, PPO's epochs): a training step samples once "
            "and updates this many times; past the first update the probability ratio to the rollout's policy "
            "(its per-token log-probabilities, recorded at rollout time) is clipped by epsilon. train.max_steps "
            "counts rollouts; the learning-rate schedule counts updates."
        ),
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig,
        description="Where rollouts are sampled (colocated or on generation actors), their timeouts and staleness.",
    )
    rewards: list[RewardConfig] = Field(
        default_factory=lambda: [RewardConfig(function="math")],
        description=(
            "The reward functions; a completion's reward is their weighted sum. Each is logged as rl/reward/<name>. "
            "A function that raises scores that sample 0 and is counted in rl/reward_errors/<name>. Empty ([]) "
            "only with distillation in mode 'replace'."
        ),
    )
    distillation: DistillationConfig | None = Field(
        None,
        description=(
            "On-policy distillation: a teacher's per-token log-probabilities of the sampled completions as the "
            "training signal (per-token reverse KL), the teacher in process or behind an endpoint. Logged as "
            "rl/distill/reverse_kl (mean per completion token, on the step's fresh samples) and "
            "time/distill_teacher_s. Unset: rewards only."
        ),
    )
    dynamic_sampling: DynamicSamplingConfig | None = Field(
        None,
        description=(
            "DAPO's dynamic sampling: groups whose (shaped) rewards are all equal are dropped and more prompts are "
            "sampled until the step holds train.micro_batch_size x train.gradient_accumulation_steps informative "
            "groups per worker, within max_rounds extra rounds. Logged as rl/groups_drawn, rl/groups_dropped, "
            "rl/groups_trained, rl/extra_rollouts, rl/refill_rounds and rl/short_steps. Unset: every group trains. "
            "Needs colocated rollouts."
        ),
    )
    curriculum: CurriculumConfig | None = Field(
        None,
        description=(
            "A curriculum from SDG: prompts every completion solved (by the first reward reaching 1) get harder "
            "symbolic variants, prompts none solved easier ones, fed to later steps (see CurriculumConfig). Only "
            "math rows whose response is an annotated solution (GSM8K's <<a*b=c>> steps and '#### answer') can be "
            "varied; others are counted in rl/curriculum/not_rewritable. Logged as rl/curriculum/harder_added, "
            "easier_added, served, queue, not_rewritable, no_draw, leaked and dropped. Needs colocated rollouts. "
            "Unset: no curriculum."
        ),
    )
    mask_truncated: bool = Field(
        False,
        description=(
            "Overlong filtering (DAPO; TRL's mask_truncated_completions): completions cut at max_new_tokens before "
            "their end of sequence are masked out of the loss; their rewards still count in their group's "
            "advantages. Logged as rl/truncated (the share of completions cut)."
        ),
    )
    overlong_buffer: int | None = Field(
        None,
        gt=0,
        description=(
            "DAPO's soft overlong punishment: a completion longer than max_new_tokens - overlong_buffer tokens has "
            "overlong_penalty x (its length - (max_new_tokens - overlong_buffer)) / overlong_buffer taken off its "
            "reward (up to overlong_penalty at max_new_tokens), before advantages and dynamic sampling. At most "
            "max_new_tokens. Unset: no punishment. Logged as rl/overlong_penalty (mean per completion)."
        ),
    )
    overlong_penalty: float = Field(
        1.0, ge=0, description="The largest overlong punishment, reached at max_new_tokens (verl's penalty_factor)."
    )
    environment: EnvironmentConfig | None = Field(
        None,
        description=(
            "A multi-turn environment (tools, limits per episode): each completion of a group becomes an episode "
            "whose turns are sampled with the tools' results (rendered by the chat template, masked from the loss) "
            "between them, the last turn scored by `rewards` plus the environment's own reward (0 when cut by a "
            "limit). The prompts must show the model its tools (rows with a `tools` column render them). Logged as "
            "rl/episode/*. Unset: one completion per sample. See docs/guides/environments.md."
        ),
    )
    row_columns: list[str] = Field(
        default_factory=list,
        description=(
            "Data columns carried with each prompt, from preparation through the rollout to the rewards: a user "
            "function with a parameter named `row` receives them as a dict (fn(completion, reference, row)). The "
            "'sql' reward's table column is carried without being listed. Preparation rejects a row that lacks a "
            "carried column and the run stops at start naming it; the values are stored with the prepared prompts."
        ),
    )

    @model_validator(mode="after")
    def _signal_is_configured(self) -> RlConfig:
        distil = self.distillation
        if not self.rewards and (distil is None or distil.mode != "replace"):
            raise ValueError(
                "train.rl.rewards is empty; name at least one reward function, or set train.rl.distillation "
                "(mode replace) to train on a teacher's log-probabilities alone"
            )
        if distil is not None and distil.mode == "replace" and self.dynamic_sampling is not None:
            raise ValueError(
                "dynamic_sampling drops groups whose rewards are all equal, but train.rl.distillation.mode is "
                "'replace' (the rewards do not train); unset dynamic_sampling or set distillation.mode=add"
            )
        if self.curriculum is not None and not self.rewards:
            raise ValueError(
                "curriculum varies the prompts the first reward finds solved or unsolved, but train.rl.rewards is "
                "empty; name a reward function or unset train.rl.curriculum"
            )
        return self

    @model_validator(mode="after")
    def _episodes_on_hf_generate(self) -> RlConfig:
        # Episodes append the environment's answers to the sampled ids between turns, through the HF sampler; the
        # vLLM actor samples one completion per prompt, and a setting it would ignore is refused instead.
        rollout = self.rollout
        if self.environment is not None and rollout.placement == "actors" and rollout.resolved_engine == "vllm":
            raise ValueError(
                "environment: multi-turn episodes are sampled with HF generate, and train.rl.rollout.engine resolves "
                "to 'vllm' here; set train.rl.rollout.engine=hf (or placement colocated)"
            )
        return self

    @model_validator(mode="after")
    def _shaping_fits(self) -> RlConfig:
        if self.overlong_buffer is not None and self.overlong_buffer > self.max_new_tokens:
            raise ValueError(
                f"overlong_buffer={self.overlong_buffer} is longer than max_new_tokens={self.max_new_tokens}; set it "
                "to at most max_new_tokens (DAPO: a quarter of it)"
            )
        if self.dynamic_sampling is not None and self.rollout.placement != "colocated":
            raise ValueError(
                "dynamic_sampling samples extra prompts on the training worker; it needs rollout.placement "
                "colocated in this version (set train.rl.rollout.placement=colocated or unset dynamic_sampling)"
            )
        if self.curriculum is not None and self.rollout.placement != "colocated":
            raise ValueError(
                "curriculum puts its variants in a step's prompts just before they are sampled; it needs "
                "rollout.placement colocated (set train.rl.rollout.placement=colocated or unset curriculum)"
            )
        return self

    @property
    def carried_columns(self) -> tuple[str, ...]:
        """Every column carried with each prompt: ``row_columns``, then those the built-in rewards read."""
        needed = [*self.row_columns, *(c for reward in self.rewards for c in reward.columns)]
        return tuple(dict.fromkeys(needed))

    def reference_kind(self, method: str) -> Literal["none", "base", "copy"]:
        """The KL term's reference for a ``method`` (lora or full) run: 'none' (no KL penalty), 'base' (the
        adapter switched off) or 'copy' (a frozen copy); the config refuses 'base' without a LoRA adapter."""
        if self.kl_coef == 0.0:
            return "none"
        if self.reference != "auto":
            return self.reference
        return "base" if method == "lora" else "copy"

    @property
    def clip_high(self) -> float:
        """The upper clip range."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high
