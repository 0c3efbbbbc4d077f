"""Config sections for the optimisation loop, the cluster it runs on, and its checkpoints."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rayft.config.base import Section
from rayft.config.objectives import ObjectiveName, ObjectiveTraits, objective_traits
from rayft.config.preference import PreferenceConfig
from rayft.config.reward_model import RewardModelTrainConfig
from rayft.config.rl import RlConfig
from rayft.config.sft_kl import SftKlConfig
from rayft.config.tracking import MlflowConfig, PrometheusConfig, WandbConfig

# DeepSpeed settings that rayft derives from train.*; train.deepspeed may not set them.
DEEPSPEED_OWNED_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "bf16", "fp16", "optimizer", "scheduler",
})  # fmt: skip


class ProfileConfig(Section):
    """Where a step's time goes: the always-on breakdown, straggler warnings, and an on-demand
    ``torch.profiler`` trace of a window of steps (``rayft profile RUN`` reads what these write)."""

    step_timing: Literal["host", "synced", "none"] = Field(
        "host",
        description=(
            "The per-step breakdown logged as time/* (data_wait, forward, backward, optimizer, comm, checkpoint, "
            "step) and MFU. 'host': host clock readings at phase boundaries, no device synchronisation (about "
            "1 microsecond per reading; on CPU exact; on GPU kernels run asynchronously, so forward and backward "
            "show launch time and the wait lands in the next synchronising phase, optimizer or comm). 'synced': "
            "torch.cuda.synchronize() at every boundary (about 4 per micro-batch) for exact GPU phases, at the "
            "cost of the CPU-GPU overlap: the host waits for each phase's kernels before it launches the next "
            "phase's, which slows steps whose launches do not keep the GPU busy (small models or micro-batches); "
            "nothing on CPU. 'none': no breakdown, no straggler check."
        ),
    )
    straggler_margin: float = Field(
        0.2,
        gt=0,
        description=(
            "Each logging window the ranks' busy time per step (step time less time waiting in collectives) is "
            "compared; a rank slower than the median by more than this fraction is named in a warning and in "
            "time/straggler_rank. Costs one small all-gather per logging window."
        ),
    )
    wait_steps: int = Field(
        1, ge=0, description="Trace window: optimizer steps after the run's first step before the profiler warms up."
    )
    warmup_steps: int = Field(
        1, ge=0, description="Trace window: steps the profiler runs but discards (its own start-up cost)."
    )
    active_steps: int = Field(
        0,
        ge=0,
        description=(
            "Trace window: steps recorded into profile/trace-rank-NNNN.json (Chrome/Perfetto and TensorBoard "
            "trace format). 0 (default) records nothing and costs nothing."
        ),
    )
    ranks: list[int] | None = Field(
        None, description="Ranks that record a trace (unset: every rank). Each writes its own file."
    )
    activities: list[Literal["cpu", "cuda"]] = Field(
        default_factory=lambda: list[Literal["cpu", "cuda"]](["cpu", "cuda"]),
        min_length=1,
        description="What the trace records: 'cpu' operators and 'cuda' kernels ('cuda' is skipped on CPU workers).",
    )
    memory_snapshot: bool = Field(
        False,
        description=(
            "On CUDA, also record allocations over the window and write profile/memory-rank-NNNN.pickle "
            "(open it at pytorch.org/memory_viz). Ignored on CPU."
        ),
    )

    @property
    def traces(self) -> bool:
        """Whether a trace window is set."""
        return self.active_steps > 0


class CallbackConfig(Section):
    """A loop callback: a class that the training loop calls at fixed points on every worker."""

    target: str = Field(
        description=(
            "The class, as 'package.module:ClassName', importable on every worker (an installed package, or a "
            "directory on PYTHONPATH). See the training guide for the hooks it may implement."
        ),
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments the class is called with (plain YAML values)."
    )

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        return {"target": value} if isinstance(value, str) else value

    @field_validator("target")
    @classmethod
    def _module_and_name(cls, value: str) -> str:
        module, sep, name = value.partition(":")
        if not sep or not module or not name:
            raise ValueError(f"{value!r} is not of the form 'package.module:ClassName'")
        return value


class TrainConfig(Section):
    """The optimisation loop: method, schedule, batch geometry, evaluation and saving cadence."""

    method: Literal["lora", "full"] = Field(
        "lora", description="Train a LoRA adapter (see the lora section) or every weight."
    )
    objective: ObjectiveName = Field(
        "sft",
        description=(
            "What is trained: 'sft' (supervised: the response's likelihood); preference training on "
            "prompt/chosen/rejected pairs: 'dpo' (against a reference model: the base with the adapter off for "
            "LoRA, reference log-probabilities computed once before training for full fine-tuning), 'orpo' "
            "(likelihood plus an odds-ratio term, no reference) or 'simpo' (length-normalised rewards with a "
            "margin, no reference), whose settings are in train.preference; or 'grpo': online reinforcement "
            "learning on the data's prompts, with completions sampled by the policy and scored by reward "
            "functions against the rows' responses (GRPO, Dr. GRPO, DAPO, RLOO: train.rl); or 'sft_kl': SFT "
            "with a KL penalty to the base model on every label token (train.sft_kl); or 'reward_model': a "
            "Bradley-Terry reward model on the same pairs, a sequence classifier with one output whose score of "
            "chosen should beat rejected (train.reward_model; its final/ loads with transformers' "
            "AutoModelForSequenceClassification and serves as train.rl.rewards' 'reward_model'). Only sft data can "
            "be packed."
        ),
    )
    strategy: Literal["ddp", "fsdp", "deepspeed"] = Field(
        "ddp",
        description=(
            "How workers share the model: 'ddp' gives each worker the whole model and averages gradients; "
            "'fsdp' (PyTorch FSDP2, ZeRO-3) splits weights, gradients and optimizer state over the workers "
            "and gathers one transformer block at a time, for models that do not fit one worker; "
            "'deepspeed' does the same with DeepSpeed ZeRO stage 3 (pip install 'rayft[deepspeed]'), whose "
            "offload options train.deepspeed takes. Checkpoints are the same under all three, so a run may "
            "resume under another strategy."
        ),
    )
    deepspeed: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "With strategy 'deepspeed': DeepSpeed config entries merged over rayft's, e.g. "
            "{zero_optimization: {offload_optimizer: {device: cpu}, offload_param: {device: cpu}}}. "
            "Batch sizes, precision, clipping and the ZeRO stage (3) come from train.* and are refused here."
        ),
    )
    learning_rate: float = Field(2e-4, gt=0, description="Peak learning rate after warmup.")
    min_learning_rate: float = Field(0.0, ge=0, description="Learning rate at the end of the cosine decay.")
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warmup from 0 to learning_rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW beta1 and beta2.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    max_grad_norm: float | None = Field(
        1.0, gt=0, description="Clip the global gradient norm to this value (unset: no clipping)."
    )
    micro_batch_size: int = Field(
        4, gt=0, description="Training units (examples, or packs) per worker per forward pass."
    )
    gradient_accumulation_steps: int = Field(
        1,
        gt=0,
        description=(
            "Micro-batches per optimizer step. The loss is normalised by the real label tokens of "
            "the whole step across workers, so 4x2 and 2x4 give the same update."
        ),
    )
    num_epochs: int = Field(1, gt=0, description="Passes over the training data (if max_steps is unset).")
    max_steps: int | None = Field(
        None, gt=0, description="Stop after this many optimizer steps (overrides num_epochs)."
    )
    eval_steps: int | None = Field(
        50, gt=0, description="Evaluate validation loss every N steps (unset: only at the end)."
    )
    eval_micro_batch_size: int | None = Field(
        None, gt=0, description="Units per worker per validation forward (default: micro_batch_size)."
    )
    save_steps: int = Field(100, gt=0, description="Save a checkpoint every N optimizer steps.")
    logging_steps: int = Field(1, gt=0, description="Write metrics (loss, lr, grad norm, tokens/s) every N steps.")
    early_stopping_patience: int | None = Field(
        None,
        gt=0,
        description="Stop after this many evaluations without a lower validation loss (unset: never).",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass: less memory, ~30% slower."
    )
    fused_loss: Literal["auto", "chunked", "liger", "none"] = Field(
        "auto",
        description=(
            "How the loss meets the output head: 'chunked' (plain torch, any device) projects and scores a chunk "
            "of positions at a time, gradients included, so full-vocabulary logits never exist at once; 'liger' "
            "runs Liger's fused linear cross-entropy (CUDA; pip install 'rayft[liger]'); 'none' computes all "
            "kept logits, then the loss. 'auto': chunked on CPU (as fast as the plain loss there, at a tenth of its "
            "memory); on GPUs the plain loss (measured up to 2.7x faster) unless its logits would take more than "
            "25% of the free GPU memory, then Liger when installed, chunked otherwise."
        ),
    )
    padding_free: bool | Literal["auto"] = Field(
        "auto",
        description=(
            "Lay the units of a micro-batch end to end in one row instead of padding each to the longest (causal "
            "LMs): no position is spent on padding, and each example keeps its own positions, so the loss is the "
            "same. DPO, ORPO and SimPO lay every chosen and rejected sequence of the micro-batch end to end, GRPO "
            "every prompt+completion (policy, reference and old-policy forwards alike). Needs attention that keeps "
            "to each example (sdpa, eager, flex_attention and flash attention all do). 'auto': for SFT on with "
            "per-example sdpa on CPU and with flash attention on GPUs (variable-length kernels), off otherwise; "
            "off for preference and RL objectives."
        ),
    )
    liger_kernels: bool = Field(
        False,
        description=(
            "Patch Liger's fused RMSNorm, SwiGLU and RoPE kernels into the model (Llama, Qwen2, Mistral, Gemma and "
            "the other families Liger supports; CUDA only; pip install 'rayft[liger]'). Its fused linear "
            "cross-entropy is train.fused_loss=liger."
        ),
    )
    compile: bool | Literal["auto"] = Field(
        "auto",
        description=(
            "Compile each transformer block with torch.compile (the first steps pay the compilation). 'auto' "
            "leaves it off: it was measured slower on CPU and over the first steps on GPUs (packed rows of "
            "varying length recompile); turn it on for long GPU runs. See the documentation's performance page."
        ),
    )
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = Field(
        "auto",
        description=(
            "Autocast dtype: 'auto' picks bf16 on GPUs that support it, fp16 on other GPUs, and fp32 on CPUs "
            "(bf16 autocast was measured faster on CPUs with bf16 instructions, but reached a higher loss); 'bf16' "
            "also autocasts on CPU; 'fp16' is for GPUs only."
        ),
    )
    frozen_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description=(
            "Precision of the frozen base layers' matrix products in a LoRA run (train.method=lora): 'bf16' "
            "stores each adapted layer's frozen weight in bf16 and multiplies a bf16 copy of its input, the "
            "output going back to float32; the adapter, norms, attention, loss and optimizer stay as "
            "train.mixed_precision says. 'auto': bf16 for LoRA on CPUs with bf16 instructions (avx512_bf16 or "
            "amx_bf16) under fp32, when the hidden size is at least 256 and the strategy is ddp (measured faster "
            "there: SFT and DPO at an equal held-out loss, GRPO's rollouts and updates alike), unless GRPO's KL "
            "term scores against a frozen copy (train.rl.reference=copy); fp32 otherwise (under autocast, as on "
            "GPUs, these products are bf16 already). GRPO's CPU generation actors build their frozen layers as "
            "the trainer does. Needs train.strategy=ddp."
        ),
    )
    cpu_threads: int | Literal["auto"] = Field(
        "auto",
        description=(
            "Threads each CPU worker's torch uses. 'auto': one per CPU the worker may use (its Ray CPUs, or "
            "every CPU of the machine in-process); more oversubscribes the cores other workers run on."
        ),
    )
    malloc_mmap_threshold_bytes: int | None = Field(
        None,
        ge=0,
        description=(
            "Host memory blocks of at least this many bytes (on Linux with glibc) are mapped on their own and returned "
            "to the system when freed, in every worker, from the start of its training. glibc's default (null) raises "
            "this threshold to 32 MiB as blocks are freed, so a step's activations stay in its heap after the step. "
            "1048576 (1 MiB) took a SmolLM2-135M LoRA worker's peak to 0.79x and an in-process run's to 0.76x, at "
            "0.64-0.70x the tokens/s on CPU (every step maps and faults its blocks anew): set it where memory, "
            "not speed, is short (benchmarks/bench_worker_memory.py, docs/performance.md). A MALLOC_MMAP_THRESHOLD_ "
            "in the environment wins."
        ),
    )
    allocator: Literal["auto", "glibc", "jemalloc"] = Field(
        "glibc",
        description=(
            "The C allocator of the Ray Train workers' processes (Linux), which hold every CPU tensor. 'glibc' (the "
            "default) keeps the system's. 'jemalloc' preloads the system's jemalloc (apt-get install libjemalloc2) "
            "with PyTorch's CPU launcher settings: a SmolLM2-135M LoRA run in one process peaked at 0.67-0.70x "
            "glibc's at 0.97-1.07x its tokens/s, but per Ray Train worker one run gave 1.06x (rank 0) and 0.78x "
            "(rank 1), and GRPO's workers grew past 9 GiB on it, in the training part of their steps, where "
            "glibc's peaked at 3.3 GiB "
            "(docs/performance.md). 'auto': jemalloc where it is installed, except for train.objective grpo and "
            "on a joined cluster, else glibc. The console says which. A run without workers (scaling.num_workers "
            "0) keeps its own process's allocator; an LD_PRELOAD or MALLOC_CONF in the environment wins."
        ),
    )
    preference: PreferenceConfig = Field(
        default_factory=PreferenceConfig,
        description="Settings of the preference objectives (train.objective dpo, orpo or simpo): beta, loss, margins.",
    )
    rl: RlConfig = Field(
        default_factory=RlConfig,
        description=(
            "Settings of train.objective grpo: samples per prompt, sampling, rewards, the loss variant, clipping and "
            "the KL penalty (see the reinforcement learning guide)."
        ),
    )
    sft_kl: SftKlConfig = Field(
        default_factory=SftKlConfig,
        description="Settings of train.objective sft_kl: the weight of the KL penalty to the base model.",
    )
    reward_model: RewardModelTrainConfig = Field(
        default_factory=RewardModelTrainConfig,
        description="Settings of train.objective reward_model: the loss's margin and score centring.",
    )
    profile: ProfileConfig = Field(
        default_factory=ProfileConfig,
        description="Step-time breakdown, straggler warnings and torch.profiler traces (see the profiling guide).",
    )
    callbacks: list[CallbackConfig] = Field(
        default_factory=list,
        description=(
            "Loop callbacks, called on every worker at the start, around each step, at each stage of a save and "
            "at the end: 'package.module:ClassName', or {target: ..., options: {...}} to pass keyword arguments. "
            "They may change between a run and its --resume."
        ),
    )

    @model_validator(mode="after")
    def _deepspeed_entries(self) -> TrainConfig:
        if self.deepspeed and self.strategy != "deepspeed":
            raise ValueError(
                f"train.deepspeed is set but train.strategy is {self.strategy!r}; set train.strategy=deepspeed "
                "or remove train.deepspeed"
            )
        owned = sorted(set(self.deepspeed) & DEEPSPEED_OWNED_KEYS)
        stage = self.deepspeed.get("zero_optimization", {}).get("stage", 3)
        if owned or stage != 3:
            what = ", ".join(owned + ([f"zero_optimization.stage={stage}"] if stage != 3 else []))
            raise ValueError(
                f"train.deepspeed sets {what}, which rayft decides (batch sizes from train.micro_batch_size, "
                "precision from train.mixed_precision, clipping from train.max_grad_norm, ZeRO stage 3); remove "
                "them from train.deepspeed"
            )
        return self

    @property
    def traits(self) -> ObjectiveTraits:
        """What the config and the driver know of the objective (:mod:`rayft.config.objectives`)."""
        return objective_traits(self.objective)

    @property
    def preference_objective(self) -> bool:
        """Whether the objective trains on preference pairs (dpo, orpo, simpo)."""
        return self.traits.data == "pairs"

    @model_validator(mode="after")
    def _frozen_precision(self) -> TrainConfig:
        if self.frozen_precision == "bf16" and self.method != "lora":
            raise ValueError(
                f"train.frozen_precision=bf16 with train.method={self.method!r}: only a LoRA run has frozen base "
                "layers; set train.method=lora or train.frozen_precision=auto"
            )
        if self.frozen_precision == "bf16" and self.strategy != "ddp":
            raise ValueError(
                f"train.frozen_precision=bf16 with train.strategy={self.strategy!r}: sharded strategies gather the "
                "frozen weights in their own dtype; set train.strategy=ddp or train.frozen_precision=auto"
            )
        return self

    @model_validator(mode="after")
    def _rl_reference(self) -> TrainConfig:
        if self.rl.kl_coef and self.rl.reference == "base" and self.method != "lora":
            raise ValueError(
                "train.rl.reference=base switches a LoRA adapter off, but train.method is 'full'; set "
                "train.rl.reference=copy (or auto)"
            )
        return self

    @model_validator(mode="after")
    def _allocator_threshold(self) -> TrainConfig:
        if self.allocator == "jemalloc" and self.malloc_mmap_threshold_bytes is not None:
            raise ValueError(
                f"train.malloc_mmap_threshold_bytes={self.malloc_mmap_threshold_bytes} is glibc's setting, but "
                "train.allocator is 'jemalloc'; set train.allocator=glibc or remove the threshold"
            )
        return self

    @field_validator("cpu_threads")
    @classmethod
    def _positive_threads(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"train.cpu_threads={value} must be at least 1 (or auto)")
        return value

    @model_validator(mode="after")
    def _lr_range(self) -> TrainConfig:
        if self.min_learning_rate > self.learning_rate:
            raise ValueError(
                f"min_learning_rate ({self.min_learning_rate}) is above learning_rate "
                f"({self.learning_rate}); lower train.min_learning_rate"
            )
        return self


class ScalingConfig(Section):
    """How many training workers to start, and what each one gets."""

    num_workers: int = Field(
        2,
        ge=0,
        description=(
            "Training workers (one process each). 0 runs the same loop in this process without "
            "Ray: for debugging and single-GPU machines without Ray."
        ),
    )
    use_gpu: bool | Literal["auto"] = Field(
        "auto", description="Give each worker a GPU; 'auto' does when the cluster has GPUs."
    )
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict,
        description="Ray resources per worker, e.g. {CPU: 4, GPU: 1} (default: 1 CPU, plus 1 GPU with use_gpu).",
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement strategy for the workers' bundles."
    )
    address: str | None = Field(
        None,
        description="Ray cluster to join ('auto', 'ray://host:10001', host:port); unset starts a local one.",
    )
    startup_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Fail if the cluster cannot host the workers within this many seconds.",
    )


class CheckpointConfig(Section):
    """Which checkpoints are kept, and how they are written."""

    num_to_keep: int | None = Field(
        2,
        gt=0,
        description=(
            "Checkpoints kept besides the latest (the best by validation loss when evaluation "
            "runs, the newest otherwise); unset keeps all."
        ),
    )
    async_upload: bool = Field(
        True,
        description="Upload checkpoints in the background so the training loop is not blocked.",
    )
    resume_data_change: Literal["refuse", "accept"] = Field(
        "refuse",
        description=(
            "What a resume does when the data prepares to another key than the checkpoint it resumes from "
            "recorded (a dataset file's rows changed since): 'refuse' stops before training with the two keys; "
            "'accept' continues on the new data, with a warning (the steps already taken were trained on the old)."
        ),
    )


class FailureConfig(Section):
    """How failures are retried and how long a stuck run may wait."""

    max_failures: int = Field(
        3,
        ge=0,
        description="Worker-group restarts before the run fails; each resumes from the last checkpoint.",
    )
    collective_timeout_s: float = Field(
        600.0,
        gt=0,
        description="A collective (gradient all-reduce) waiting longer than this ends the run with an error.",
    )
    sigterm_grace_s: float = Field(
        120.0,
        gt=0,
        description=(
            "On SIGTERM (preemption, kubectl delete) the run saves a checkpoint and stops; if that takes "
            "longer than this many seconds, it is interrupted. Keep it below the platform's kill grace period."
        ),
    )


class LoggingConfig(Section):
    """Where per-step metrics go besides metrics.jsonl."""

    tensorboard: bool = Field(True, description="Write TensorBoard event files under tensorboard/.")
    console: bool = Field(True, description="Print a progress line with loss and ETA.")
    mlflow: MlflowConfig | None = Field(
        None, description="Log params, tags, metrics and artifacts to an MLflow server (pip install 'rayft[mlflow]')."
    )
    wandb: WandbConfig | None = Field(
        None, description="Log the config, tags and metrics to Weights & Biases (pip install 'rayft[wandb]')."
    )
    prometheus: PrometheusConfig = Field(
        default_factory=PrometheusConfig,
        description="Live metrics for Prometheus; `logging.prometheus: true` is short for {enabled: true}.",
    )

    @field_validator("prometheus", mode="before")
    @classmethod
    def _prometheus_switch(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value
