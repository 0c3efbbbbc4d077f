"""Preparing training data: read, mix, split, render, tokenize, pack, and cache as parquet units.

Reads top to bottom: compute the cache key from the datasets' file fingerprints, the tokenizer and
the settings, and either reuse the cached result, or read every dataset row by row (a bad row is
kept as a rejected row) and resolve its format, plan which rows go where (a pure planner, from a
seeded hash of each row's key), and tokenize (Ray Data ``map_batches`` across the cluster's CPUs,
or in-process: same bytes) and write it. The manifest ``prepared.json`` is written last, inside a
temporary directory that is renamed into place, so a crash never leaves a half-written cache
that looks complete.

Rows that cannot become training examples are written to ``rejected.jsonl`` (row id, source,
reason) and counted; preparation stops when their share passes ``data.max_rejected_fraction``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft.config.data import DataConfig
from rayft.config.model import ModelConfig
from rayft.data.cache_keys import (
    cache_key,
    data_cache_dir,
    dataset_fingerprint,
    rows_fingerprint,
    tokenizer_files_fingerprint,
    tokenizer_fingerprint,
)
from rayft.data.executors import tokenize_in_process, tokenize_on_ray
from rayft.data.packing import make_units
from rayft.data.prepared import SPLITS, PreparedData, write_prepared
from rayft.data.reader import Source, read_sources
from rayft.data.report import check_rejected, log_summary, warn_truncated, write_report
from rayft.data.seq2seq import refuse_unpaired_formats
from rayft.data.split_plan import Record, plan_records
from rayft.data.stats import collect_rejected, compute_stats
from rayft.data.tokenize import TextTokenizer, TokenizeJob
from rayft.models.architecture import refuse_packing, resolve_architecture
from rayft.models.loading import load_tokenizer

log = logging.getLogger("rayft.data")


def prepare_data(
    data: DataConfig, model: ModelConfig, seed: int, *, report_dir: Path | None, use_ray: bool
) -> PreparedData:
    """Tokenized, cached training (and validation) units for ``data``; reused when the inputs are unchanged.

    With ``use_ray`` tokenization runs as a Ray Data job on the already initialised cluster.
    """
    return prepare(data, model, seed, report_dir=report_dir, use_ray=use_ray).prepared


@dataclass(frozen=True)
class PrepareOutcome:
    """A prepared dataset, whether it came from the cache, and how long preparing took."""

    prepared: PreparedData
    reused: bool
    elapsed_s: float


def prepare(
    data: DataConfig,
    model: ModelConfig,
    seed: int,
    *,
    report_dir: Path | None,
    use_ray: bool,
    ray_address: str | None = None,
) -> PrepareOutcome:
    """:func:`prepare_data`, also saying whether the cache was reused.

    With ``use_ray`` and no Ray initialised yet, Ray is started (or ``ray_address`` joined) only
    when there is something to tokenize, and shut down afterwards.
    """
    refuse_packing(model, data.packing)
    seq2seq = resolve_architecture(model) == "seq2seq"
    started = time.monotonic()
    fingerprint = tokenizer_files_fingerprint(model)
    tokenizer = None if fingerprint else load_tokenizer(model)
    if tokenizer is not None:
        fingerprint = "loaded:" + tokenizer_fingerprint(tokenizer)
    sources, fingerprints = _fingerprints(data)
    key = cache_key(data, seed, str(fingerprint), fingerprints, seq2seq=seq2seq)
    root = data_cache_dir(data) / key
    prepared = PreparedData.load(root)
    reused = prepared is not None
    if prepared is not None:
        log.info("data: reusing the prepared dataset %s (no tokenization)", root)
    else:
        sources = sources if sources is not None else read_sources(data)
        records = plan_records([len(s.rows) for s in sources], [s.config.weight for s in sources],
                               train_sources=len(data.datasets), validation_fraction=data.validation_fraction,
                               seed=seed)  # fmt: skip
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
        prepared = build(data, seed, tokenizer, sources, records, root=root, key=key, use_ray=use_ray,
                         ray_address=ray_address, seq2seq=seq2seq)  # fmt: skip
    log_summary(prepared)
    if not seq2seq:  # an encoder-decoder's source and target have limits of their own
        warn_truncated(prepared, "data.max_seq_length", data.max_seq_length)
    write_report(prepared, report_dir)
    check_rejected(prepared, data.max_rejected_fraction, report_dir)
    return PrepareOutcome(prepared, reused, time.monotonic() - started)


def _fingerprints(data: DataConfig) -> tuple[list[Source] | None, list[str]]:
    """Every dataset's fingerprint, from its files where it has them. When one has none (a URI, a Hub
    dataset), the datasets are read, its rows hashed, and the sources returned for reuse."""
    datasets = [*data.datasets, *data.validation_datasets]
    found = [dataset_fingerprint(ds) for ds in datasets]
    if all(f is not None for f in found):
        return None, [str(f) for f in found]
    sources = read_sources(data)
    return sources, [f if f is not None else rows_fingerprint(s.rows) for f, s in zip(found, sources, strict=True)]


def build(
    data: DataConfig,
    seed: int,
    tokenizer: Any,
    sources: Sequence[Source],
    records: Sequence[Record],
    *,
    root: Path,
    key: str,
    use_ray: bool,
    ray_address: str | None = None,
    seq2seq: bool = False,
) -> PreparedData:
    """Tokenize every record, pack or not, and write the cache directory atomically. ``seq2seq``:
    source/target pairs for an encoder-decoder model (:mod:`rayft.data.seq2seq`)."""
    import pyarrow as pa

    if seq2seq:
        refuse_unpaired_formats([s.format.format for s in sources])
    job = TokenizeJob(
        TextTokenizer.from_hf(tokenizer),
        tuple((s.config, s.format) for s in sources),
        data.max_seq_length,
        data.overlong,
        data.train_on_prompt,
        data.seq2seq_limits() if seq2seq else None,
    )
    inputs = pa.table({
        "sample_id": pa.array([r.sample_id for r in records], pa.int64()),
        "dataset": pa.array([r.source for r in records], pa.int32()),
        "row": pa.array([sources[r.source].rows[r.row] for r in records], pa.string()),
    })  # fmt: skip
    log.info("data: tokenizing %d rows %s", len(records), "with Ray Data" if use_ray else "in-process")
    tokenized = tokenize_on_ray(job, inputs, ray_address) if use_ray else tokenize_in_process(job, inputs)
    rows = tokenized.sort_by("sample_id").to_pylist()
    rejected = collect_rejected(rows, records, sources, data.overlong)
    splits = {name: [row for row, rec in zip(rows, records, strict=True) if rec.split == name and not row["reason"]]
              for name in SPLITS}  # fmt: skip
    units = {name: make_units(examples, data.packing, data.max_seq_length, seed, seq2seq=seq2seq)
             for name, examples in splits.items()}  # fmt: skip
    stats = compute_stats(rows, records, sources, units, data)
    return write_prepared(root, key, units=units, rejected=rejected, stats=stats, data=data, seq2seq=seq2seq)
