"""What a pipeline stage's fingerprint covers, and the data the train stage reads: the pieces of
configuration and the hashes of local files that, when they change, make a stage run again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rayft.config import DataConfig, DatasetConfig, RayftConfig
from rayft.errors import ConfigError
from rayft.pipeline.fingerprint import hash_file, hash_path
from rayft.runs import layout
from rayft.runs.records import StageRecord, trained_final

SDG_PATH = "stage:sdg"
"""A dataset path that stands for the synthetic data of this pipeline's ``sdg`` stage."""


def model_identity(cfg: RayftConfig) -> dict[str, Any]:
    """The model section, plus the names, sizes and times of a local model directory's files."""
    identity: dict[str, Any] = {"config": json.loads(cfg.model.model_dump_json())}
    path = Path(cfg.model.name).expanduser()
    if path.exists():
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        identity["files"] = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return identity


def final_manifest_hash(run_dir: Path, records: dict[str, StageRecord], stage: str | None = None) -> str | None:
    """The hash of the manifest of ``stage``'s final model (default: the last trained model); None when
    there is no such model or manifest."""
    if stage is None:
        final = trained_final(run_dir, records)
    else:
        final = records[stage].output(run_dir, "final") if stage in records else None
    manifest = final / layout.MANIFEST_FILE if final is not None else None
    return hash_file(manifest) if manifest is not None and manifest.is_file() else None


def local_files(section: Any) -> dict[str, str]:
    """The hash of every existing local path found under a ``path`` key of a config section."""
    found: dict[str, str] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "path" and isinstance(value, str) and "://" not in value and Path(value).exists():
                    found[value] = hash_path(Path(value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(section)
    return found


def train_data_config(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord]) -> DataConfig:
    """The data section training uses: the SDG output stands in for ``stage:sdg`` paths, and is the
    default training data when the config requests an ``sdg`` stage but writes no ``data`` section
    (its tool-use traces with ``sdg.tool_use``, else its questions and answers)."""
    sdg_data = records["sdg"].output(run_dir, "data_jsonl") if "sdg" in records else None
    datasets = list(cfg.data.datasets)
    if "data" not in cfg.model_fields_set and sdg_data is not None:
        # Tool-use traces are conversations (messages and tools); other rows, a question and its answer.
        datasets = [
            DatasetConfig(path=SDG_PATH, name="sdg", format="messages")
            if cfg.sdg.tool_use
            else DatasetConfig(
                path=SDG_PATH,
                name="sdg",
                format="template",
                input_template="Question: {question}\nAnswer:",
                output_template="{answer}",
            )
        ]
    return cfg.data.model_copy(update={"datasets": with_sdg_output(datasets, sdg_data)})


def stage_data_config(data: DataConfig, run_dir: Path, records: dict[str, StageRecord]) -> DataConfig:
    """A later stage's data section (its own datasets merged in) with the SDG output for its ``stage:sdg`` paths."""
    sdg_data = records["sdg"].output(run_dir, "data_jsonl") if "sdg" in records else None
    return data.model_copy(update={"datasets": with_sdg_output(list(data.datasets), sdg_data)})


def with_sdg_output(datasets: list[DatasetConfig], sdg_data: Path | None) -> list[DatasetConfig]:
    """``datasets`` with the SDG output's path for each ``stage:sdg`` path (a one-line error without one)."""
    resolved = []
    for ds in datasets:
        if ds.path == SDG_PATH:
            if sdg_data is None:
                raise ConfigError(
                    f"data.datasets: path {SDG_PATH!r} needs the sdg stage's output; add an `sdg:` section "
                    "or point the dataset at a file"
                )
            resolved.append(ds.model_copy(update={"path": str(sdg_data)}))
        else:
            resolved.append(ds)
    return resolved
