"""Config sections of preference pairs from verified samples (``rayft pairs``, the ``pairs`` stage of
``rayft run``) and of the preference training that follows SFT in a pipeline (the ``preference``
stage)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from rayft.config.base import Section
from rayft.config.data import DataConfig, DatasetConfig
from rayft.config.generation import GenerationConfig
from rayft.config.preference import PreferenceConfig
from rayft.config.sdg import SdgDecontaminationConfig
from rayft.config.train import TrainConfig

DEFAULT_PAIRS_PROMPT = "Question: {question}\nAnswer:"
"""The prompt of each problem: the one the quickstart's SFT data and eval's gsm8k task use."""


def _default_sampler() -> GenerationConfig:
    return GenerationConfig(temperature=0.8, top_p=0.95, max_new_tokens=256, batch_size=16, stop=["Question:"])


class PairsConfig(Section):
    """Preference pairs: k answers sampled per problem, each checked against the reference's final
    number, a correct one as ``chosen`` beside a wrong one as ``rejected``."""

    problems: DatasetConfig = Field(
        default_factory=lambda: DatasetConfig(path="builtin:arithmetic"),
        description="Problems, each solution ending '#### N' (a local GSM8K train.jsonl, builtin:arithmetic).",
    )
    question_column: str = Field("question", description="Column of the problems holding the question.")
    answer_column: str = Field("answer", description="Column holding the reference solution (its '#### N' is checked).")
    num_problems: int | None = Field(200, gt=0, description="Use the first N problems (all when null).")
    model: str | None = Field(
        None,
        description=(
            "The model that answers: a run directory, a checkpoint or final/ directory, a model directory, a Hub id "
            "or a built-in name. Unset: in `rayft run`, the train stage's final model (on-policy pairs); in "
            "`rayft pairs`, model.name."
        ),
    )
    samples_per_problem: int = Field(
        4,
        ge=2,
        description="Answers sampled per problem (k): more finds pairs for more problems, at k generations each.",
    )
    max_pairs_per_problem: int = Field(
        1, gt=0, description="Pairs kept per problem, each with a different correct and a different wrong answer."
    )
    answer_match: Literal["strict", "flexible"] = Field(
        "strict",
        description=(
            "How an answer's number is read (evaluation's GSM8K checker): 'strict', the first '#### N' (an answer "
            "without one is unparseable, and a wrong answer); 'flexible', the last number of the answer."
        ),
    )
    prompt_template: str = Field(
        DEFAULT_PAIRS_PROMPT, description="The prompt of each problem, with {question}; it becomes the pairs' prompt."
    )
    use_chat_template: bool = Field(
        True,
        description=(
            "Sample with the prompt as a user turn of the model's chat template (as SFT data with use_chat_template "
            "renders it); false sends the raw prompt text. The preference stage trains the pairs the same way."
        ),
    )
    system_prompt: str | None = Field(None, description="A system message before each prompt (chat only).")
    generation: GenerationConfig = Field(
        default_factory=_default_sampler,
        description=(
            "Backend, sampling (temperature > 0: k different answers) and scaling of the sampler; its model is "
            "replaced by pairs.model (or the pipeline's trained model)."
        ),
    )
    decontamination: SdgDecontaminationConfig = Field(
        default_factory=SdgDecontaminationConfig,
        description="Evaluation sets whose problems must not become pairs (as for SDG rows); leaks are counted.",
    )
    seed: int | None = Field(
        None, ge=0, description="Seed of sampling and of the choice of pairs (default: the run's)."
    )
    output_dir: str | None = Field(None, description="Where pairs are written (default: <storage_path>/<name>/pairs).")

    @model_validator(mode="after")
    def _prompt_has_question(self) -> PairsConfig:
        if "{question}" not in self.prompt_template:
            raise ValueError(
                f"prompt_template {self.prompt_template!r} has no {{question}}; put {{question}} where the problem goes"
            )
        return self


class PreferenceStageConfig(PreferenceConfig):
    """The preference training of ``rayft run`` after SFT: it starts from the train stage's model (a LoRA
    adapter merged into its base first, which is then DPO's reference) and trains on the pairs stage's pairs.
    The loss's settings (``beta``, ``loss``, ...) sit directly in this section and are the training's
    ``train.preference``; ``train`` and ``data`` name what else differs from the pipeline's sections."""

    objective: Literal["dpo", "orpo", "simpo"] = Field(
        "dpo", description="The preference objective (train.objective of the second training)."
    )
    train: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "What differs from the train section in the second training, other than its preference settings "
            "(this section's own), as a nested mapping merged into it, e.g. {learning_rate: 5.0e-6, num_epochs: 1}."
        ),
    )
    data: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "What differs from the data section (e.g. {max_seq_length: 512, validation_fraction: 0.05}); its "
            "datasets are the pairs, and packing is off."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _no_nested_preference(cls, raw: Any) -> Any:
        refuse_nested_method_section(raw, "preference")
        return raw


def refuse_nested_method_section(raw: Any, stage: str) -> None:
    """Refuse ``<stage>.train.<stage>``, the spelling before the stage held its method's settings itself.

    Raises:
        ValueError: the old spelling, with the path that replaces it.
    """
    train = raw.get("train") if isinstance(raw, dict) else None
    nested = train.get(stage) if isinstance(train, dict) else None
    if nested is None:
        return
    key = next(iter(nested), "<setting>") if isinstance(nested, dict) and nested else "<setting>"
    raise ValueError(
        f"{stage}.train.{stage}.{key} is no longer read: the stage's own settings sit directly under {stage}; "
        f"write {stage}.{key}"
    )


def merge_nested(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in, mapping by mapping (an override's scalar or list replaces)."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_nested(merged[key], value)
        else:
            merged[key] = value
    return merged


def preference_train_section(train: TrainConfig, stage: PreferenceStageConfig) -> TrainConfig:
    """The train section of the preference training: ``train`` with the stage's changes, its objective, and
    its preference settings as ``train.preference``.

    Raises:
        ValueError: a change names an unknown field or a bad value (its dotted path under preference.train).
    """
    method = stage.model_dump(mode="json", include=set(PreferenceConfig.model_fields))
    changes = {**stage.train, "objective": stage.objective, "preference": method}
    raw = merge_nested(train.model_dump(mode="json"), changes)
    validated: TrainConfig = validated_section(TrainConfig, raw, "preference.train")
    return validated


def preference_data_section(data: DataConfig, stage: PreferenceStageConfig, pairs: DatasetConfig) -> DataConfig:
    """The data section of the preference training: ``data`` with the stage's changes, the pairs as its
    only dataset, and packing off (a pair's two sides are not packed)."""
    raw = merge_nested(data.model_dump(mode="json"), stage.data)
    raw.update(datasets=[pairs.model_dump(mode="json")], packing=False)
    validated: DataConfig = validated_section(DataConfig, raw, "preference.data")
    return validated


def validated_section(model: type[Any], raw: dict[str, Any], where: str) -> Any:
    """``raw`` validated as ``model``; the first error as one line naming its dotted path under ``where``."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(part) for part in (where, *first["loc"]))
        raise ValueError(f"{path}: {first['msg']} (got {first.get('input')!r}); fix or remove that key") from None
