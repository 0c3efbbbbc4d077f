"""DPO's reference log-probabilities for full fine-tuning, computed once before training and stored
with the prepared pairs, so that no second model is held while the policy trains.

A pass over every prepared pair file with the base model (a Ray Data job, one task per file, or in
this process: same numbers) writes a copy of the file with two more columns, ``ref_chosen_logps``
and ``ref_rejected_logps``, under ``<prepared root>/reference-<key>/`` (staged, then renamed into
place, a manifest last). The key names the prepared data, the model, its precision and the device
kind, so a second run with the same inputs reuses the pass. :func:`rayft.training.methods.preference.method.
collate_preference` hands the stored values to the loss. With LoRA the reference is the base with
the adapter off (no pass), and ORPO and SimPO need none.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from rayft.config.model import LoraConfig, ModelConfig
from rayft.data.prepared import PreparedData, PreparedSplit
from rayft.files import replace_dir, staging_dir

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rayft.train")

REFERENCE_VERSION = 1  # bump when the stored values of the same inputs change
MANIFEST = "reference.json"
PAIRS_PER_BATCH = 8  # pairs per forward pass: a fixed size, so the numbers never depend on the executor


def needs_reference(objective: str, method: str) -> bool:
    """Whether a run needs stored reference log-probabilities: DPO with full fine-tuning."""
    return objective == "dpo" and method == "full"


def reference_device(use_gpu: bool | str, *, use_ray: bool) -> str:
    """Where the pass runs: on a GPU when training would (``scaling.use_gpu``; 'auto': when the Ray
    cluster, or this machine without Ray, has one), else on CPUs."""
    if use_gpu is True or use_gpu is False:
        return "cuda" if use_gpu else "cpu"
    if use_ray:
        import ray

        return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class ReferenceJob:
    """What a reference task needs: the model (built as training builds it) and its precision."""

    model: ModelConfig
    lora: LoraConfig
    mixed_precision: str
    device_type: str

    def key(self, data_key: str) -> str:
        """The content key of the pass over the prepared data ``data_key``."""
        header = {"version": REFERENCE_VERSION, "data": data_key, "model": self.model.model_dump(mode="json"),
                  "mixed_precision": self.mixed_precision, "device": self.device_type}  # fmt: skip
        return hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()[:16]


def attach_reference(prepared: PreparedData, job: ReferenceJob, *, use_ray: bool) -> PreparedData:
    """``prepared`` with its pair files replaced by copies that hold the reference log-probabilities
    (computed now, or reused from an earlier pass with the same key)."""
    root = Path(prepared.root) / f"reference-{job.key(prepared.key)}"
    if not (root / MANIFEST).is_file():
        tasks = _tasks(prepared)
        staging = staging_dir(root)
        try:
            log.info("dpo: reference log-probabilities of %d pair files %s", len(tasks),
                     "with Ray Data" if use_ray else "in-process")  # fmt: skip
            pairs = sum(_run_on_ray(job, tasks, staging) if use_ray else _run_here(job, tasks, staging))
            (staging / MANIFEST).write_text(json.dumps({"pairs": pairs, "model": job.model.name}))
            replace_dir(staging, root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return replace(prepared, train=_moved(prepared.train, prepared.root, root),
                   validation=_moved(prepared.validation, prepared.root, root))  # fmt: skip


def _tasks(prepared: PreparedData) -> list[tuple[str, str]]:
    """(source file, its path relative to the prepared root) of every split's files."""
    splits = [s for s in (prepared.train, prepared.validation) if s is not None]
    return [(f, str(Path(f).relative_to(prepared.root))) for split in splits for f in split.files]


@overload
def _moved(split: PreparedSplit, old_root: str, new_root: Path) -> PreparedSplit: ...
@overload
def _moved(split: None, old_root: str, new_root: Path) -> None: ...
def _moved(split: PreparedSplit | None, old_root: str, new_root: Path) -> PreparedSplit | None:
    if split is None:
        return None
    return replace(split, files=tuple(str(new_root / Path(f).relative_to(old_root)) for f in split.files))


def _run_here(job: ReferenceJob, tasks: Sequence[tuple[str, str]], staging: Path) -> Iterator[int]:
    scorer = ReferenceScorer(job)
    for source, relative in tasks:
        yield scorer.write(source, staging / relative)


def _run_on_ray(job: ReferenceJob, tasks: Sequence[tuple[str, str]], staging: Path) -> Iterator[int]:
    """One Ray Data task per file; each worker process builds the model once (:func:`_scorer`)."""
    import ray

    gpus = 1 if job.device_type == "cuda" else 0
    items = [{"source": source, "target": str(staging / relative)} for source, relative in tasks]
    score: Any = _score_block  # Ray's stubs do not type a function with keyword arguments
    dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        score, batch_size=1, fn_kwargs={"job": job}, num_cpus=1, num_gpus=gpus
    )
    for row in dataset.iter_rows():
        yield int(row["pairs"])


_SCORERS: dict[str, ReferenceScorer] = {}


def _score_block(batch: dict[str, Any], *, job: ReferenceJob) -> dict[str, Any]:
    """A Ray Data task: write the reference copy of each file in ``batch``; their pair counts."""
    key = job.key("")
    if key not in _SCORERS:
        _SCORERS.clear()  # one model per worker process
        _SCORERS[key] = ReferenceScorer(job)
    scorer = _SCORERS[key]
    return {"pairs": [scorer.write(s, Path(t)) for s, t in zip(batch["source"], batch["target"], strict=True)]}


class ReferenceScorer:
    """The base model, built as training builds it (same dtype, attention and precision), scoring pairs."""

    def __init__(self, job: ReferenceJob) -> None:
        import torch

        from rayft.models.architecture import model_type
        from rayft.models.loading import load_tokenizer
        from rayft.training.modeling.model import build_training_model
        from rayft.training.modeling.precision import resolve_precision

        self.device = torch.device("cuda" if job.device_type == "cuda" else "cpu")
        model: torch.nn.Module = build_training_model(job.model, job.lora, "full", self.device.type,
                                                      gradient_checkpointing=False, restore_dir=None)  # fmt: skip
        self.model = model.to(self.device).eval()
        self.precision = resolve_precision(job.mixed_precision, self.device.type, model_type(job.model))
        self.pad_token_id = load_tokenizer(job.model).pad_token_id
        self.attn_implementation = job.model.attn_implementation

    def write(self, source: str, target: Path) -> int:
        """Write ``source``'s pairs with their reference log-probabilities to ``target``; the pair count."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        target.parent.mkdir(parents=True, exist_ok=True)
        parquet = pq.ParquetFile(source)
        schema = parquet.schema_arrow
        for name in ("ref_chosen_logps", "ref_rejected_logps"):
            schema = schema.append(pa.field(name, pa.float64()))
        count = 0
        # One row group at a time, kept as it was: a worker holds a group's pairs, not the file's. A file
        # without pairs still gets its copy, with the two columns.
        with pq.ParquetWriter(target, schema) as writer:
            for group in range(parquet.num_row_groups):
                table = parquet.read_row_group(group)
                chosen, rejected = self.score(table.to_pylist())
                table = table.append_column("ref_chosen_logps", pa.array(chosen, pa.float64()))
                table = table.append_column("ref_rejected_logps", pa.array(rejected, pa.float64()))
                writer.write_table(table)
                count += table.num_rows
        return count

    def score(self, units: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
        """Each pair's summed response log-probabilities under the model, chosen and rejected."""
        import torch

        from rayft.training.methods.preference.method import collate_preference, pair_logps
        from rayft.training.modeling.attention import row_multiple

        chosen: list[float] = []
        rejected: list[float] = []
        multiple = row_multiple(self.attn_implementation)
        with torch.no_grad():
            for start in range(0, len(units), PAIRS_PER_BATCH):
                batch = collate_preference(units[start : start + PAIRS_PER_BATCH], self.pad_token_id, multiple)
                logps = pair_logps(self.model, batch.rows.to(self.device), self.precision)
                chosen += logps.chosen.double().cpu().tolist()
                rejected += logps.rejected.double().cpu().tolist()
        return chosen, rejected
