"""Deciding what to load for a model source given to ``rayft eval / compare / export / chat / generate``
and to a sweep's task evaluation.

A source is a Hub id, a built-in name, a .gguf file, a model directory, a checkpoint directory
(``checkpoints/step-N`` or ``final/``) or a run directory, where ``eval.checkpoint`` picks one; a
pipeline run directory (``rayft run``) stands for the run of its last training stage.
A LoRA checkpoint is evaluated on its base model (read from the checkpoint's
``rayft_config.yaml``, else ``adapter_config.json``) with the adapter applied, unmerged.
Nothing here imports torch; the run's checkpoint is chosen by :mod:`rayft.runs.selection`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from rayft.config.model import ModelConfig
from rayft.errors import CheckpointError, ModelError
from rayft.models.hub import check_model_available, check_tokenizer_files, read_model_config
from rayft.models.loading import builtin_gguf_path
from rayft.models.registry import BUILTIN_MODELS
from rayft.models.resolve import resolve_model_source
from rayft.runs import layout
from rayft.runs.checkpoints import (
    checkpoint_of_run,
    is_pipeline_dir,
    is_run_dir,
    trained_run_of_pipeline,
    unfinished_training_stage,
)
from rayft.runs.manifest import read_manifest, sha256_file, verify_checkpoint

log = logging.getLogger(__name__)

SourceKind = Literal["model", "lora", "full"]


@dataclass(frozen=True)
class ResolvedSource:
    """What to load for one source: a model, plus a LoRA adapter applied on top when ``kind`` is lora."""

    source: str
    kind: SourceKind
    model: ModelConfig
    adapter_path: str | None = None
    checkpoint_dir: str | None = None
    step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    lineage: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for logs and reports."""
        if self.kind == "lora":
            return f"{self.model.name} + LoRA adapter {self.adapter_path}"
        return self.model.name


def resolve_source(source: str, default_model: ModelConfig, checkpoint: str = "latest") -> ResolvedSource:
    """What to load for ``source``; ``default_model`` supplies dtype and friends for model names.

    Checkpoint directories are verified against their manifest first, so a corrupted or
    half-written checkpoint is refused with the file that is wrong.
    """
    path = Path(source).expanduser()
    if not path.is_dir():
        _check_exists(source)
        return ResolvedSource(source, "model", _named_model(source, default_model))
    if is_pipeline_dir(path):
        path = _trained_run(path)
    directory = checkpoint_of_run(path, checkpoint) if is_run_dir(path) else path
    manifest = read_manifest(directory)
    if manifest is not None:
        problems = verify_checkpoint(directory)
        if problems:
            raise CheckpointError(f"checkpoint {directory} is damaged: {'; '.join(problems)}")
    metrics = dict(manifest.metrics) if manifest else {}
    lineage = dict(manifest.info) if manifest else {}
    step = manifest.step if manifest else None
    if lineage.get("method") == "task":
        raise ModelError(
            f"{directory} holds a custom task's model ({lineage.get('task')}), not a language model; rayft eval, "
            "compare, export, chat and generate take language models. Load its weights with "
            "safetensors.torch.load_file on model.safetensors into the task's build_model()"
        )
    if (directory / layout.ADAPTER_CONFIG).is_file():
        base = base_model_of_adapter(directory, default_model)
        return ResolvedSource(source, "lora", base, str(directory), str(directory), step, metrics, lineage)
    if (directory / "config.json").is_file():
        read_model_config(directory, setting="model source")
        check_tokenizer_files(directory, setting="model source")
        # The checkpoint's own tokenizer files carry the chat template it was trained with.
        model = default_model.model_copy(
            update={"name": str(directory.resolve()), "revision": None, "gguf_file": None, "chat_template": None}
        )
        kind: SourceKind = "full" if manifest is not None else "model"
        return ResolvedSource(source, kind, model, None, str(directory), step, metrics, lineage)
    raise ModelError(
        f"{directory} is neither a model directory (config.json), a LoRA adapter (adapter_config.json) nor a "
        "run directory (checkpoints/, final/); give one of those, a Hub id, a .gguf file or a built-in name"
    )


def _trained_run(pipeline: Path) -> Path:
    """The run directory of a pipeline's final trained model (logged, so the user sees which), or ModelError."""
    run = trained_run_of_pipeline(pipeline)
    if run is None:
        stopped = unfinished_training_stage(pipeline)
        if stopped is not None:
            raise ModelError(
                f"{pipeline} is a pipeline run whose {stopped} stage did not finish; run the pipeline again "
                f"(rayft run CONFIG), or give its stage's run directory {pipeline / stopped} to use its checkpoints"
            )
        stages = sorted(p.stem for p in (pipeline / layout.STAGE_RECORDS_DIR).glob("*.json"))
        raise ModelError(
            f"{pipeline} is a pipeline run with no trained model (finished stages: {', '.join(stages) or 'none'}); "
            f"run its train stage (rayft run CONFIG), or give a model or run directory"
        )
    log.info("%s is a pipeline run; using its trained model in %s", pipeline, run)
    return run


def _check_exists(source: str) -> None:
    """Fail here, not inside a generation actor (and before any model of a comparison loads), when a
    local path does not exist, names a file that is no model, or a Hub model cannot be had offline."""
    kind = resolve_model_source(source).kind
    if kind != "gguf" and Path(source).expanduser().is_file():
        raise ModelError(
            f"model source {source!r} is a file, not a model; give a run directory, a checkpoint or model "
            f"directory, a .gguf file, a Hub id, or a built-in name ({', '.join(BUILTIN_MODELS)})"
        )
    missing = (kind == "local" and not Path(source).expanduser().is_dir()) or (
        kind == "gguf" and not Path(source).expanduser().is_file()
    )
    if missing:
        raise ModelError(
            f"model source {source!r} does not exist; give a run directory, a checkpoint or model directory, a "
            f".gguf file, a Hub id, or a built-in name ({', '.join(BUILTIN_MODELS)})"
        )
    check_model_available(source, setting="model source")


def _named_model(source: str, default_model: ModelConfig) -> ModelConfig:
    if source == default_model.name:
        return default_model
    return default_model.model_copy(update={"name": source, "revision": None, "gguf_file": None})


def base_model_of_adapter(directory: Path, default_model: ModelConfig) -> ModelConfig:
    """The base model a LoRA checkpoint was trained on.

    Read from the ``model`` section of its ``rayft_config.yaml`` (with the chat template and
    dtype of training); for adapters trained elsewhere, from ``base_model_name_or_path`` of
    ``adapter_config.json``.
    """
    import yaml

    saved = directory / layout.CHECKPOINT_CONFIG_FILE
    if saved.is_file():
        raw = yaml.safe_load(saved.read_text(encoding="utf-8")) or {}
        try:
            return ModelConfig.model_validate(raw.get("model", {}))
        except ValidationError as exc:
            raise CheckpointError(f"{saved}: its model section is invalid ({exc.errors()[0]['msg']})") from exc
    adapter_cfg = json.loads((directory / layout.ADAPTER_CONFIG).read_text(encoding="utf-8"))
    base = adapter_cfg.get("base_model_name_or_path")
    if not base:
        raise CheckpointError(
            f"{directory}: the adapter names no base model (no {layout.CHECKPOINT_CONFIG_FILE}, and "
            f"{layout.ADAPTER_CONFIG} lacks base_model_name_or_path); evaluate it from its run directory"
        )
    log.info("%s has no %s; using base model %s from adapter_config.json", directory, saved.name, base)
    return _named_model(str(base), default_model)


def fingerprint_source(resolved: ResolvedSource) -> dict[str, Any]:
    """What identifies the evaluated weights: sha256 of weight files (from the manifest when the
    checkpoint has one), or the Hub id and revision of a remote model."""
    files: dict[str, str] = {}
    if resolved.adapter_path:
        files.update(_weight_hashes(Path(resolved.adapter_path)))
    name_path = Path(resolved.model.name).expanduser()
    if name_path.is_dir():
        files.update({f"base/{k}": v for k, v in _weight_hashes(name_path).items()})
    elif name_path.suffix == ".gguf" and name_path.is_file():
        files[f"base/{name_path.name}"] = sha256_file(name_path)
    elif resolved.model.name in BUILTIN_MODELS:
        gguf = builtin_gguf_path(resolved.model.name)
        files[f"base/{gguf.name}"] = sha256_file(gguf)
    digest = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest() if files else None
    return {
        "kind": resolved.kind,
        "model": resolved.model.name,
        "revision": resolved.model.revision,
        "adapter": resolved.adapter_path,
        "step": resolved.step,
        "files": files,
        "sha256": digest,
    }


def _weight_hashes(directory: Path) -> dict[str, str]:
    manifest = read_manifest(directory)
    weights = sorted(p.name for p in directory.glob("*.safetensors"))
    if manifest is not None:
        return {name: manifest.files[name].sha256 for name in weights if name in manifest.files}
    return {name: sha256_file(directory / name) for name in weights}
