"""Preparing one window of examples: read its rows, tokenize them in fixed-size batches, pack them
(first-fit decreasing within the window), write the window's units as one Parquet file, and return
a one-row summary (counts, the length histogram, the rejected rows) for the driver to add up.

A window is a run of consecutive sample ids of one split (:func:`plan_windows`), so what it holds,
and therefore how it packs, depends on the data, the seed and the settings only: never on how many
workers or blocks run it. Examples are in a seeded hash order already (see
:mod:`rayft.data.split_plan`), so every window is a fair sample of the split and packs about as
densely as the whole split would. The same :func:`prepare_window` runs in a Ray Data task or in
this process (same bytes).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.data.packing import plan_packs
from rayft.data.preference import PairPreparation, pair_units, tokenize_pair_rows
from rayft.data.prepared import IGNORE_INDEX, unit_schema
from rayft.data.read.rows import take_rows
from rayft.data.tokenize import as_table
from rayft.errors import DataError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from rayft.data.split_plan import Plan
    from rayft.data.tokenize import TokenizeJob

WINDOW_MIN, WINDOW_MAX = 2048, 16384
"""Bounds of the examples in a packing window: an eighth of the split, within these bounds, so a
small split is one window (packed as a whole) and a large one gives every CPU several windows."""
BATCH_ROWS = 256  # rows tokenized at a time inside a window
ROWS_PER_GROUP = 2048  # units per Parquet row group: what a training rank reads at a time


@dataclass(frozen=True)
class Window:
    """Sample ids ``start`` to ``stop`` (exclusive) of ``split``, its ``index``-th window."""

    split: str
    index: int
    start: int
    stop: int


def window_size(num_examples: int) -> int:
    """Examples per window of a split of ``num_examples`` (see :data:`WINDOW_MIN`)."""
    return min(WINDOW_MAX, max(WINDOW_MIN, -(-num_examples // 8)))


def fits_one_window(num_examples: int) -> bool:
    """Whether a plan of ``num_examples`` (both splits) is small enough for the driver to prepare
    itself, without Ray Data: at most one smallest window (:data:`WINDOW_MIN`), the memory a Ray
    Data task would hold. Ray Data would give such a plan one or two tasks, and its start costs more
    than their work: its executor and helper actors, and a worker process that loads the tokenizer
    (about 5 s and 10 CPU-s on 2 cores for a fresh Ray, against under a second of tokenizing)."""
    return num_examples <= WINDOW_MIN


def plan_windows(num_train: int, num_total: int) -> list[Window]:
    """The windows of the training examples (sample ids below ``num_train``), then of the validation ones."""
    windows = []
    for split, low, high in (("train", 0, num_train), ("validation", num_train, num_total)):
        size = window_size(high - low)
        windows += [Window(split, i, start, min(start + size, high)) for i, start in enumerate(range(low, high, size))]
    return windows


def window_inputs(plan: Plan, window: Window) -> pa.Table:
    """The input block of one window task: its split and index, and each example's id, dataset and row."""
    import numpy as np
    import pyarrow as pa

    count = window.stop - window.start
    return pa.table({
        "split": pa.array([window.split] * count, pa.string()),
        "window": pa.array(np.full(count, window.index, dtype=np.int32)),
        "sample_id": pa.array(np.arange(window.start, window.stop, dtype=np.int64)),
        "dataset": pa.array(plan.sources[window.start : window.stop]),
        "row": pa.array(plan.rows[window.start : window.stop]),
    })  # fmt: skip


@dataclass(frozen=True)
class WindowSettings:
    """What a window task needs besides the tokenize job: where the rows are and the units go."""

    rows_files: tuple[str, ...]  # one spilled rows file per dataset (see rayft.data.read.rows.RowStore)
    staging: str  # the prepared dataset's staging directory
    packing: bool
    max_seq_length: int
    seed: int
    seq2seq: bool
    pairs: PairPreparation | None = None  # preference pairs (train.objective dpo, orpo, simpo)


def prepare_window(job: TokenizeJob, settings: WindowSettings, block: pa.Table) -> pa.Table:
    """Tokenize, pack and write one window (``block``: see :func:`window_inputs`); its one-row summary."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    split, index = str(block["split"][0]), int(block["window"][0])
    texts = _texts(settings.rows_files, block["dataset"].to_numpy(), block["row"].to_numpy())
    ids, datasets = block["sample_id"].to_pylist(), block["dataset"].to_pylist()
    tokenized = pa.concat_tables(
        _tokenize(job, settings.pairs, ids[i : i + BATCH_ROWS], datasets[i : i + BATCH_ROWS], texts[i : i + BATCH_ROWS])
        for i in range(0, len(ids), BATCH_ROWS)
    )
    kept = pc.equal(tokenized["reason"], "")
    examples, rejected = tokenized.filter(kept), tokenized.filter(pc.invert(kept))
    if settings.pairs is not None:
        units = pair_units(examples)
    else:
        units = unit_table(examples, _packs(examples, settings, index), seq2seq=settings.seq2seq)
    relative = f"{split}/part-{index:05d}.parquet"
    if units.num_rows:
        (Path(settings.staging) / split).mkdir(exist_ok=True)
        pq.write_table(units, Path(settings.staging) / relative, row_group_size=ROWS_PER_GROUP)
    return _summary(split, index, relative if units.num_rows else "", examples=examples, rejected=rejected, units=units)


def _tokenize(
    job: TokenizeJob, pairs: PairPreparation | None, ids: list[int], datasets: list[int], texts: list[str]
) -> pa.Table:
    """One batch of rows tokenized: as preference pairs, or as SFT examples."""
    if pairs is not None:
        return tokenize_pair_rows(job, pairs, ids, datasets, texts)
    return as_table(job({"sample_id": ids, "dataset": datasets, "row": texts}))


def _texts(rows_files: tuple[str, ...], datasets: np.ndarray, rows: np.ndarray) -> list[str]:
    """The JSON text of each (dataset, row), in order, taken from the datasets' rows files."""
    import numpy as np

    texts: list[str] = [""] * len(rows)
    for dataset in np.unique(datasets).tolist():
        where = np.flatnonzero(datasets == dataset)
        for position, text in zip(where.tolist(), take_rows(rows_files[dataset], rows[where]), strict=True):
            texts[position] = text
    return texts


def _packs(examples: pa.Table, settings: WindowSettings, index: int) -> list[list[int]] | None:
    """The window's packs in a seeded order, or None without packing. The first window of a split
    shuffles with the seed itself, as the whole split did before windows, so a split of one window
    packs exactly as it did."""
    import pyarrow.compute as pc

    if not settings.packing:
        return None
    packs = plan_packs(pc.list_value_length(examples["input_ids"]).to_pylist(), settings.max_seq_length)
    random.Random(settings.seed if index == 0 else f"{settings.seed}:{index}").shuffle(packs)
    return packs


def unit_table(examples: pa.Table, packs: list[list[int]] | None, *, seq2seq: bool = False) -> pa.Table:
    """Training units (see :mod:`rayft.data.prepared`) from tokenized ``examples``: one per example, or
    one per pack, built with Arrow's list kernels (no token becomes a Python int). An encoder-decoder's
    unit counts its source and target tokens in ``num_tokens``."""
    import numpy as np
    import pyarrow as pa

    count = examples.num_rows
    order = np.arange(count) if packs is None else np.fromiter((i for p in packs for i in p), np.int64, count)
    sizes = np.ones(count, np.int64) if packs is None else np.asarray([len(p) for p in packs], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])  # each unit's first example, in ``order``
    ids = examples["input_ids"].combine_chunks().take(pa.array(order))
    labels = examples["labels"].combine_chunks().take(pa.array(order))
    id_ends = _ends(ids)
    label_ends = _ends(labels)
    flat_labels = labels.flatten().to_numpy(zero_copy_only=False)
    trained = np.concatenate([[0], np.cumsum(flat_labels != IGNORE_INDEX)])
    lengths = np.diff(id_ends)
    positions = np.arange(id_ends[-1], dtype=np.int32) - np.repeat(id_ends[:-1], lengths).astype(np.int32)
    unit_ids, unit_labels = id_ends[starts], label_ends[starts]
    num_tokens = np.diff(unit_ids) + (np.diff(unit_labels) if seq2seq else 0)
    sample_ids = examples["sample_id"].combine_chunks().take(pa.array(order))
    carried = "row" in examples.column_names
    if carried and packs is not None:  # the config refuses packing with train.objective grpo
        raise DataError("data: columns carried to train.rl's rewards need data.packing=false; set it")
    rows = [examples["row"].combine_chunks().take(pa.array(order))] if carried else []
    return pa.table([
        pa.ListArray.from_arrays(pa.array(unit_ids, pa.int32()), ids.flatten()),
        pa.ListArray.from_arrays(pa.array(unit_labels, pa.int32()), labels.flatten()),
        pa.ListArray.from_arrays(pa.array(unit_ids, pa.int32()), pa.array(positions, pa.int32())),
        pa.ListArray.from_arrays(pa.array(starts, pa.int32()), sample_ids),
        pa.array(num_tokens, pa.int32()),
        pa.array(np.diff(trained[unit_labels]), pa.int32()),
        *rows,
    ], schema=unit_schema(row=carried))  # fmt: skip


def _ends(lists: pa.Array) -> np.ndarray:
    """Where each list of ``lists`` ends in its flattened values, after a leading 0."""
    import numpy as np
    import pyarrow.compute as pc

    return np.concatenate([[0], np.cumsum(pc.list_value_length(lists).to_numpy(zero_copy_only=False))]).astype(np.int64)


def _summary(split: str, index: int, file: str, *, examples: pa.Table, rejected: pa.Table, units: pa.Table) -> pa.Table:
    """One row: the window's file and counts, its kept rows' length histogram and truncations, and
    its rejected rows (sample id, reason, detail). Small whatever the window's size."""
    import numpy as np
    import pyarrow as pa

    lengths, counts = np.unique(examples["length"].to_numpy(), return_counts=True)
    sums = {name: int(np.asarray(units[name]).sum()) for name in ("num_tokens", "num_label_tokens")}
    return pa.table({
        "split": [split], "window": [index], "file": [file], "units": [units.num_rows],
        "examples": [examples.num_rows], "tokens": [sums["num_tokens"]], "label_tokens": [sums["num_label_tokens"]],
        "truncated": [int(np.asarray(examples["truncated"]).sum())],
        "length_values": [lengths.tolist()], "length_counts": [counts.tolist()],
        "rejected_ids": [rejected["sample_id"].to_pylist()], "rejected_reasons": [rejected["reason"].to_pylist()],
        "rejected_details": [rejected["detail"].to_pylist()],
    })  # fmt: skip


def run_window_block(block: Any, *, job_key: str = "", job_ref: Any = (), settings: Any = None) -> Any:
    """A Ray Data ``map_batches`` task: one window (one block) through :func:`prepare_window`, with the
    tokenize job fetched once per worker process and content key (see :func:`rayft.data.tokenize.load_job`)."""
    from rayft.data.tokenize import load_job

    return prepare_window(load_job(job_key, job_ref), settings, block)
