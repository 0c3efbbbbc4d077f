"""Config sections for training data: sources, formats, tokenization limits, packing."""

from __future__ import annotations

import string
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rayft.config.base import Section

DataFormat = Literal["auto", "template", "alpaca", "messages", "prompt_completion", "text", "preference"]


DEFAULT_MAX_ROW_BYTES = 16 * 2**20
"""The default bound on one row's size (16 MiB): far above any training example, far below a
machine's memory."""


class DatasetConfig(Section):
    """One dataset: where it is, which rows to take, and how to turn a row into an example."""

    path: str = Field(
        description=(
            "A local file (.jsonl, .json, .parquet, .csv) or directory, a URI pyarrow reads "
            "(s3://, gs://), a Hugging Face Hub dataset name (openai/gsm8k), or a built-in set "
            "(builtin:arithmetic, generated offline)."
        ),
    )
    name: str | None = Field(None, description="A short label for reports; defaults to the path's last component.")
    config_name: str | None = Field(None, description="Hub dataset configuration (e.g. 'main' for openai/gsm8k).")
    data_dir: str | None = Field(
        None, description="Directory inside a Hub dataset repo to read (e.g. 'data/rust' of bigcode/the-stack-smol)."
    )
    split: str = Field("train", description="Split to read from a Hub dataset.")
    revision: str | None = Field(None, description="Hub dataset revision.")
    format: DataFormat = Field(
        "auto",
        description=(
            "How rows become examples: 'template' (input_template/output_template), 'alpaca' "
            "(instruction, input, output), 'messages' (OpenAI or ShareGPT turns, loss on every "
            "assistant turn), 'prompt_completion', 'text' (continued pre-training), 'preference' "
            "(prompt + chosen + rejected pairs, for train.objective dpo, orpo or simpo), or 'auto' "
            "(detected from the columns, and reported)."
        ),
    )
    input_template: str | None = Field(
        None,
        description=(
            "Prompt template for format 'template', with {placeholders} named by field_mapping "
            "keys, e.g. 'Question: {question}\\n'."
        ),
    )
    output_template: str | None = Field(None, description="Response template for format 'template', e.g. '{answer}'.")
    field_mapping: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Maps a placeholder or a format's field name to the dataset column that holds it, "
            "e.g. {question: problem}. Unmapped names are read from the column of the same name."
        ),
    )
    system_prompt: str | None = Field(
        None, description="A system message put before every conversation of this dataset."
    )
    use_chat_template: bool = Field(
        True,
        description=(
            "Render prompt/response pairs through the tokenizer's chat template (as user and "
            "assistant turns) when it has one; false keeps the raw template text."
        ),
    )
    weight: float = Field(
        1.0,
        gt=0,
        description="Mixing weight against the other datasets (relative share of training rows).",
    )
    max_rows: int | None = Field(None, gt=0, description="Read at most this many rows (all when unset).")
    max_row_bytes: int = Field(
        DEFAULT_MAX_ROW_BYTES,
        gt=0,
        description=(
            "Largest row read, in bytes (a JSON Lines line, a JSON list item, a CSV or Parquet row as JSON). "
            "A larger row is rejected as row_too_large with its file, line and size, and counted like any bad "
            "row; a JSON Lines line, a CSV record or a JSON list item is never held whole past this size (a "
            "Parquet row is measured in Arrow before it is converted), so it also bounds a reader's memory. "
            "Default 16 MiB."
        ),
    )
    files: str | None = Field(
        None,
        description=(
            "Read the local directory 'path' as source files: a glob relative to it (e.g. '**/*.rs'). Each file "
            "becomes rows with columns text, path (relative) and chunk, for format 'text'; a file that is not "
            "UTF-8 becomes a row rejected as bad_encoding (reported in rejected.jsonl, counted)."
        ),
    )
    chunk_chars: int | None = Field(
        None,
        gt=0,
        description=(
            "With files: cut each file into rows of at most this many characters, at line ends (a longer "
            "line is cut where it passes the limit); unset: one row per file."
        ),
    )

    @field_validator("input_template", "output_template")
    @classmethod
    def _template_fills(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
        except ValueError as exc:
            raise ValueError(
                f"not a template ({exc}); write {{column}} placeholders, and double braces {{{{ }}}} for literal ones"
            ) from None
        for name in names:
            if not name.isidentifier():
                raise ValueError(
                    f"placeholder {{{name}}} is not a plain name; use {{column}} placeholders and map them to "
                    "columns with field_mapping"
                )
        return value

    @model_validator(mode="after")
    def _template_needs_templates(self) -> DatasetConfig:
        if self.format == "template" and not (self.input_template and self.output_template):
            raise ValueError(
                "format 'template' needs both input_template and output_template; set them or "
                "choose another format (alpaca, messages, prompt_completion, text, auto)"
            )
        if self.chunk_chars is not None and self.files is None:
            raise ValueError(
                f"chunk_chars={self.chunk_chars} is set without files; set files (a glob such as '**/*.py') or "
                "remove chunk_chars"
            )
        return self


class DataConfig(Section):
    """Datasets, the validation split, and how examples become token sequences."""

    datasets: list[DatasetConfig] = Field(
        default_factory=lambda: [DatasetConfig(path="builtin:arithmetic")],
        min_length=1,
        description="Training datasets, mixed by their weights.",
    )
    validation_datasets: list[DatasetConfig] = Field(
        default_factory=list,
        description="Validation datasets; when empty, validation_fraction of the training rows is held out.",
    )
    validation_fraction: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="Share of training rows held out for validation when no validation dataset is given (0 disables).",
    )
    max_seq_length: int = Field(
        1024, gt=8, description="Longest token sequence a training example (or a pack) may have."
    )
    max_source_length: int | None = Field(
        None,
        gt=0,
        description=(
            "Encoder-decoder models: longest source (encoder input) in tokens, EOS included; unset, "
            "max_seq_length. Causal models ignore it."
        ),
    )
    max_target_length: int | None = Field(
        None,
        gt=0,
        description=(
            "Encoder-decoder models: longest target (decoder labels) in tokens, EOS included; unset, "
            "max_seq_length. Causal models ignore it."
        ),
    )
    overlong: Literal["truncate", "drop", "error"] = Field(
        "truncate",
        description=(
            "What to do with an example longer than max_seq_length (an encoder-decoder's source or "
            "target longer than max_source_length / max_target_length): cut it, drop it (counted and "
            "reported), or stop with an error naming the row."
        ),
    )
    train_on_prompt: bool = Field(
        False, description="Compute the loss on prompt tokens too (default: response tokens only)."
    )
    packing: bool = Field(
        False,
        description=(
            "Pack several examples into each sequence up to max_seq_length; positions restart and "
            "attention never crosses examples. Causal models only: refused for encoder-decoder models."
        ),
    )
    max_rejected_fraction: float = Field(
        0.01,
        ge=0,
        le=1,
        description="Stop before training when more than this share of rows is rejected (bad rows).",
    )
    shuffle_buffer_size: int = Field(
        10_000,
        gt=0,
        description=(
            "Training units per deterministic shuffle window on each worker; a dataset smaller "
            "than workers x this is fully reshuffled every epoch."
        ),
    )
    cache_dir: str | None = Field(
        None,
        description="Where tokenized datasets are cached (default: $RAYFT_CACHE/datasets, or ~/.cache/rayft/datasets).",
    )

    def seq2seq_limits(self) -> tuple[int, int]:
        """(max source, max target tokens) of an encoder-decoder's examples."""
        return self.max_source_length or self.max_seq_length, self.max_target_length or self.max_seq_length
