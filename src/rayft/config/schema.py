"""The root of the config tree: one YAML file describes a whole rayft run."""

from __future__ import annotations

from pydantic import Field, model_validator

from rayft.config.base import Section
from rayft.config.data import DataConfig
from rayft.config.evaluation import EvalConfig, ExportConfig
from rayft.config.inference import InferenceConfig
from rayft.config.k8s import K8sConfig
from rayft.config.model import LoraConfig, ModelConfig
from rayft.config.pairs import PairsConfig, PreferenceStageConfig, preference_train_section
from rayft.config.rl_stage import RlStageConfig
from rayft.config.sdg import SdgConfig
from rayft.config.serve import ServeConfig
from rayft.config.task import TaskConfig
from rayft.config.train import (
    CheckpointConfig,
    FailureConfig,
    LoggingConfig,
    ScalingConfig,
    TrainConfig,
)
from rayft.config.tune import TuneConfig


class RayftConfig(Section):
    """A rayft run: the model, its data, how to train it, and where results go.

    Sections left out of the YAML take their defaults; ``model_fields_set`` tells which ones the
    user wrote, which is how a pipeline knows the stages it was asked to run.
    """

    name: str = Field(
        "rayft-run",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Run name: the run directory is <storage_path>/<name>.",
    )
    storage_path: str = Field(
        "runs",
        description=(
            "Where runs are written: a local directory, a shared mount, or a URI pyarrow opens (s3://, gs://, "
            "hdfs://, file://; s3://bucket/p?endpoint_override=host:9000&scheme=http for S3-compatible servers). "
            "With a URI, `rayft train` writes through a local mirror under $RAYFT_CACHE/runs and uploads "
            "checkpoints (manifest last), metrics and final/; the other commands need a local path."
        ),
    )
    seed: int = Field(42, ge=0, description="Seed for data order, initialisation and dropout.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The model to fine-tune.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="The LoRA adapter.")
    data: DataConfig = Field(default_factory=DataConfig, description="Training and validation data.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="The optimisation loop.")
    scaling: ScalingConfig = Field(default_factory=ScalingConfig, description="Workers and resources.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoint retention and upload."
    )
    failure: FailureConfig = Field(default_factory=FailureConfig, description="Retries and timeouts.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metric sinks.")
    sdg: SdgConfig = Field(
        default_factory=SdgConfig, description="Synthetic data generation (rayft sdg): seeds, generator, filters."
    )
    pairs: PairsConfig = Field(
        default_factory=PairsConfig,
        description="Preference pairs from verified samples (rayft pairs; in rayft run, from the trained model).",
    )
    preference: PreferenceStageConfig = Field(
        default_factory=PreferenceStageConfig,
        description=(
            "Preference training after SFT in rayft run (dpo, orpo, simpo) on the pairs stage's pairs: the loss's "
            "settings (train.preference's fields) directly here, other training changes under preference.train."
        ),
    )
    rl: RlStageConfig = Field(
        default_factory=RlStageConfig,
        description=(
            "Reinforcement learning (GRPO) after SFT in rayft run, on the data's prompts: the RL settings "
            "(train.rl's fields) directly here, other training changes under rl.train."
        ),
    )
    eval: EvalConfig = Field(
        default_factory=EvalConfig, description="Evaluation and comparison of models (rayft eval / compare)."
    )
    export: ExportConfig = Field(
        default_factory=ExportConfig, description="Export of a checkpoint to a Hugging Face model (rayft export)."
    )
    inference: InferenceConfig = Field(
        default_factory=InferenceConfig,
        description="Using a model: sampling of rayft chat, and sampling and scaling of rayft generate.",
    )
    serve: ServeConfig = Field(
        default_factory=ServeConfig,
        description="An OpenAI-compatible endpoint on Ray Serve (rayft serve): replicas, batching, adapters, address.",
    )
    task: TaskConfig = Field(
        default_factory=TaskConfig,
        description="A custom task (a model other than a causal LM) that `rayft train` runs instead of model/data.",
    )
    k8s: K8sConfig = Field(
        default_factory=K8sConfig,
        description="Kubernetes manifests (`rayft k8s render`, the Helm chart): image, namespace, storage, secrets.",
    )
    tune: TuneConfig | None = Field(
        None,
        description=(
            "Hyper-parameter search (`rayft tune`; `rayft run` tunes before it trains): the search space over "
            "dotted config paths, the metric, the search algorithm and the scheduler."
        ),
    )

    @model_validator(mode="after")
    def _task_replaces_model_and_data(self) -> RayftConfig:
        if self.task.path is None:
            return self
        # Compared with the defaults rather than model_fields_set, so that a dumped config reloads.
        unused = [name for name in ("model", "lora", "data") if getattr(self, name) != type(getattr(self, name))()]
        if unused:
            raise ValueError(
                f"task.path={self.task.path!r} is set, so the task builds the model and the data, but the config "
                f"also sets {', '.join(unused)}; remove {'them' if len(unused) > 1 else 'it'} (task options go in "
                "task.options)"
            )
        if self.train.strategy != "ddp":
            raise ValueError(
                f"train.strategy={self.train.strategy!r}: a custom task (task.path) trains with 'ddp' (each worker "
                "holds the whole model); set train.strategy=ddp"
            )
        return self

    @model_validator(mode="after")
    def _quantized_base_trains_an_adapter_under_ddp(self) -> RayftConfig:
        quantize = self.lora.quantize
        if quantize == "none":
            if self.lora.quantize_embeddings:
                raise ValueError(
                    "lora.quantize_embeddings=true stores the embedding and head in lora.quantize's form, but "
                    "lora.quantize is 'none': set lora.quantize=nf4 (or int8), or lora.quantize_embeddings=false"
                )
            return self
        if self.train.method != "lora":
            raise ValueError(
                f"lora.quantize={quantize!r} quantizes the frozen base under a LoRA adapter, but train.method is "
                f"{self.train.method!r}: quantized weights cannot be trained; set train.method=lora or "
                "lora.quantize=none"
            )
        if self.train.strategy != "ddp":
            raise ValueError(
                f"lora.quantize={quantize!r} with train.strategy={self.train.strategy!r}: bitsandbytes' quantized "
                "weights cannot be sharded or offloaded (FSDP, DeepSpeed ZeRO-3); set train.strategy=ddp (a "
                "quantized base is small enough for each worker to hold whole) or lora.quantize=none"
            )
        return self

    @model_validator(mode="after")
    def _lora_variants_fit_the_run(self) -> RayftConfig:
        if self.train.method != "lora":
            return self
        quantize = self.lora.quantize
        if quantize != "none" and self.lora.init != "default":
            raise ValueError(
                f"lora.init={self.lora.init!r} rewrites the base weights from their decomposition, which "
                f"lora.quantize={quantize!r} stores quantized; set lora.init=default or lora.quantize=none"
            )
        if self.lora.use_dora and self.train.frozen_precision == "bf16":
            raise ValueError(
                "train.frozen_precision=bf16 with lora.use_dora=true: DoRA divides by the norm of the base weight, "
                "which bf16 storage would change; set train.frozen_precision=auto (fp32 under DoRA) or "
                "lora.use_dora=false"
            )
        return self

    @model_validator(mode="after")
    def _preference_pairs_are_not_packed(self) -> RayftConfig:
        objective, traits = self.train.objective, self.train.traits
        if traits.token_loss:
            return self
        if self.data.packing and traits.unpacked_because:
            raise ValueError(
                f"train.objective={objective!r} with data.packing=true: {traits.unpacked_because}; "
                f"set data.packing=false{traits.packed_instead}"
            )
        if self.task.path is not None:
            raise ValueError(
                f"train.objective={objective!r} with task.path set: a custom task trains its own objective; set "
                "train.objective=sft or remove task.path"
            )
        return self

    @model_validator(mode="after")
    def _an_actor_per_worker(self) -> RayftConfig:
        rollout, workers = self.train.rl.rollout, max(self.scaling.num_workers, 1)
        if self.train.traits.samples and rollout.placement == "actors" and (rollout.num_actors or workers) < workers:
            raise ValueError(
                f"train.rl.rollout.num_actors={rollout.num_actors} is fewer than the {workers} training workers "
                f"(scaling.num_workers): each worker samples on actors of its own; set num_actors to at least {workers}"
            )
        return self

    @model_validator(mode="after")
    def _preference_stage_trains(self) -> RayftConfig:
        preference_train_section(self.train, self.preference)  # its errors name preference.train.<key>
        return self
