"""Preparing training data: read, mix, split, render, tokenize, pack, and cache as parquet units.

Reads top to bottom: compute the cache key from the datasets' file fingerprints, the tokenizer and
the settings, and either reuse the cached result, or read every dataset row by row into spilled
rows files (a bad row is kept as a rejected row) and resolve its format, plan which rows go where
(a pure planner, from a seeded hash of each row's key, kept as arrays), and prepare the examples in
windows of consecutive sample ids (:mod:`rayft.data.windows`: Ray Data ``map_batches`` tasks across
the cluster's CPUs, or in-process: same bytes). Each window task tokenizes its rows in fixed-size
batches, packs them within the window, and writes its units as Parquet into a staging directory;
the driver only adds up the windows' small summaries. The manifest ``prepared.json`` is written
last, and the staging directory is then renamed into place, so a crash never leaves a
half-written cache that looks complete.

Rows that cannot become training examples are written to ``rejected.jsonl`` (row id, source,
reason) and counted; preparation stops when their share passes ``data.max_rejected_fraction``, as
soon as it has (before the remaining windows) when more windows are left.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
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
from rayft.data.executors import windows_in_process, windows_on_ray
from rayft.data.preference import PairPreparation, refuse_mismatched_formats
from rayft.data.prepared import REJECTED_FILE, PreparedData, commit_prepared, open_staging
from rayft.data.read.rows import Source, read_sources
from rayft.data.report import check_carried, check_rejected, log_summary, rejected_error, warn_truncated, write_report
from rayft.data.seq2seq import refuse_unpaired_formats
from rayft.data.split_plan import Plan, plan_examples
from rayft.data.stats import Tally
from rayft.data.tokenize import TextTokenizer, TokenizeJob
from rayft.data.windows import WindowSettings, fits_one_window, plan_windows, window_inputs
from rayft.models.architecture import refuse_packing, resolve_architecture
from rayft.models.loading import load_tokenizer

log = logging.getLogger("rayft.data")

ROWS_DIR = ".rows"  # the spilled rows files, inside the staging directory, removed before the commit


def prepare_data(
    data: DataConfig,
    model: ModelConfig,
    seed: int,
    *,
    report_dir: Path | None,
    use_ray: bool,
    pairs: PairPreparation | None = None,
    carry: Sequence[str] = (),
) -> PreparedData:
    """Tokenized, cached training (and validation) units for ``data``; reused when the inputs are unchanged.

    With ``use_ray`` tokenization runs as a Ray Data job on the already initialised cluster (a plan
    that fits one window is prepared in this process: :func:`rayft.data.windows.fits_one_window`); with
    ``pairs``, the rows are preference pairs (:mod:`rayft.data.preference`); ``carry``: raw columns kept
    with each example (the ``row`` column of :mod:`rayft.data.prepared`).
    """
    return prepare(data, model, seed, report_dir=report_dir, use_ray=use_ray, pairs=pairs, carry=carry).prepared


@dataclass(frozen=True)
class PrepareResult:
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
    pairs: PairPreparation | None = None,
    carry: Sequence[str] = (),
) -> PrepareResult:
    """:func:`prepare_data`, also saying whether the cache was reused.

    With ``use_ray`` and no Ray initialised yet, Ray is started (or ``ray_address`` joined) only
    when Ray Data tokenizes (more than one window's examples), and shut down afterwards.
    """
    refuse_packing(model, data.packing)
    seq2seq = resolve_architecture(model) == "seq2seq"
    started = time.monotonic()
    fingerprint = tokenizer_files_fingerprint(model)
    tokenizer = None if fingerprint else load_tokenizer(model)
    if tokenizer is not None:
        fingerprint = "loaded:" + tokenizer_fingerprint(tokenizer)
    sources, fingerprints = _fingerprints(data)
    key = cache_key(data, seed, str(fingerprint), fingerprints, seq2seq=seq2seq,
                    pairs=None if pairs is None else asdict(pairs), carry=carry)  # fmt: skip
    root = data_cache_dir(data) / key
    prepared = PreparedData.load(root)
    reused = prepared is not None
    if prepared is not None:
        log.info("data: reusing the prepared dataset %s (no tokenization)", root)
    else:
        staging = open_staging(root)
        try:
            sources = sources if sources is not None else read_sources(data, staging / ROWS_DIR)
            plan = plan_examples([len(s.rows) for s in sources], [s.config.weight for s in sources],
                                 train_sources=len(data.datasets), validation_fraction=data.validation_fraction,
                                 seed=seed)  # fmt: skip
            tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
            prepared = build(data, seed, tokenizer, sources, plan, staging=staging, root=root, key=key,
                             use_ray=use_ray, ray_address=ray_address, seq2seq=seq2seq,
                             report_dir=report_dir, pairs=pairs, carry=tuple(carry))  # fmt: skip
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log_summary(prepared)
    if not seq2seq:  # an encoder-decoder's source and target have limits of their own
        warn_truncated(prepared, "data.max_seq_length", data.max_seq_length)
    write_report(prepared, report_dir)
    check_carried(prepared, carry, report_dir)
    check_rejected(prepared, data.max_rejected_fraction, report_dir)
    return PrepareResult(prepared, reused, time.monotonic() - started)


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
    plan: Plan,
    *,
    staging: Path,
    root: Path,
    key: str,
    use_ray: bool,
    ray_address: str | None = None,
    seq2seq: bool = False,
    report_dir: Path | None = None,
    pairs: PairPreparation | None = None,
    carry: tuple[str, ...] = (),
) -> PreparedData:
    """Prepare every window of the ``plan`` into ``staging``, add up their summaries, and commit it as
    ``root``: with Ray Data when ``use_ray`` and the plan is more than one window (see
    :func:`~rayft.data.windows.fits_one_window`), else in this process. ``seq2seq``: source/target
    pairs for an encoder-decoder model (:mod:`rayft.data.seq2seq`). Stops with DataError, before the
    remaining windows, once the rejected rows pass ``data.max_rejected_fraction`` (their report so
    far copied into ``report_dir``)."""
    if seq2seq:
        refuse_unpaired_formats([s.format.format for s in sources])
    refuse_mismatched_formats([(s.name, s.format.format) for s in sources], pairs is not None)
    job = TokenizeJob(
        TextTokenizer.from_hf(tokenizer),
        tuple((s.config, s.format) for s in sources),
        data.max_seq_length,
        data.overlong,
        data.train_on_prompt,
        data.seq2seq_limits() if seq2seq else None,
        carry,
    )
    settings = WindowSettings(tuple(str(s.rows.path) for s in sources), str(staging), data.packing,
                              data.max_seq_length, seed, seq2seq, pairs)  # fmt: skip
    windows = plan_windows(plan.num_train, len(plan))
    blocks = [window_inputs(plan, w) for w in windows]
    on_ray = use_ray and not fits_one_window(len(plan))
    log.info("data: preparing %d rows in %d windows %s", len(plan), len(windows),
             "with Ray Data" if on_ray else "in-process")  # fmt: skip
    if on_ray:
        summaries = windows_on_ray(job, settings, blocks, ray_address)
    else:
        summaries = windows_in_process(job, settings, blocks)
    with (staging / REJECTED_FILE).open("w", encoding="utf-8") as report:
        tally = Tally(plan, sources, data.overlong, report)
        _add_up(tally, summaries, len(windows), str(root), data.max_rejected_fraction,
                staging=staging, report_dir=report_dir)  # fmt: skip
    shutil.rmtree(staging / ROWS_DIR, ignore_errors=True)
    validation = tally.split("validation")
    prepared = PreparedData(key, str(root), tally.split("train"), validation if validation.num_units else None,
                            data.packing, data.max_seq_length, tally.stats(data.packing, data.max_seq_length),
                            seq2seq, pairs=pairs is not None)  # fmt: skip
    return commit_prepared(staging, prepared)


def _add_up(
    tally: Tally,
    summaries: Iterator[dict[str, Any]],
    windows: int,
    root: str,
    max_fraction: float,
    *,
    staging: Path,
    report_dir: Path | None,
) -> None:
    """Add every window's summary to ``tally``; DataError as soon as the rejected rows pass
    ``max_fraction`` of all rows while windows are left (they can only add more)."""
    for done, summary in enumerate(summaries, start=1):
        tally.add(summary, root)
        if done < windows and tally.rejected > max_fraction * len(tally.plan):
            tally.report.flush()
            # The staging directory goes; the report so far stays in the run (or beside the cache).
            where = report_dir / REJECTED_FILE if report_dir else Path(f"{root}.{REJECTED_FILE}")
            where.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(staging / REJECTED_FILE, where)
            raise rejected_error(tally.rejected, len(tally.plan), max_fraction, tally.reasons, where,
                                 done_windows=done, windows=windows)  # fmt: skip
