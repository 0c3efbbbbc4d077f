"""Preparing training data: read, mix, split, render, tokenize, pack, and cache as parquet units.

Reads top to bottom: read every dataset and resolve its format, plan which rows go where (a pure
planner), compute the cache key from exactly those rows plus the tokenizer and the settings, and
either reuse the cached result or tokenize (Ray Data ``map_batches`` across the cluster's CPUs,
or in-process: same bytes) and write it. The manifest ``prepared.json`` is written last, inside a
temporary directory that is renamed into place, so a crash never leaves a half-written cache
that looks complete.

Rows that cannot become training examples are written to ``rejected.jsonl`` (row id, source,
reason) and counted; preparation stops when their share passes ``data.max_rejected_fraction``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.cache import cache_root
from rayft.config.data import DataConfig, DatasetConfig
from rayft.config.model import ModelConfig
from rayft.data.formats import REASONS, ResolvedFormat, resolve_format
from rayft.data.packing import build_units, make_unit, plan_packs
from rayft.data.prepared import MANIFEST, PreparedData, PreparedSplit
from rayft.errors import DataError, StorageError

if TYPE_CHECKING:
    import pyarrow as pa

    from rayft.data.tokenize import TokenizeJob

log = logging.getLogger("rayft.data")

PREPARE_VERSION = 1  # bump when the output of the same inputs changes
BATCH_ROWS = 256
ROWS_PER_FILE = 2048
REJECTED_FILE = "rejected.jsonl"
SPLITS = ("train", "validation")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "chat_template.jinja", "chat_template.json",
)  # fmt: skip


@dataclass(frozen=True)
class Source:
    """One dataset as read: its config, report label, resolved format and JSON rows."""

    config: DatasetConfig
    name: str
    format: ResolvedFormat
    rows: list[str]


@dataclass(frozen=True)
class Record:
    """One example to prepare: its sample id, split, and the row it comes from."""

    sample_id: int
    split: str
    source: int
    row: int


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
    from rayft.models.loading import load_tokenizer

    started = time.monotonic()
    fingerprint = tokenizer_files_fingerprint(model)
    tokenizer = None if fingerprint else load_tokenizer(model)
    if tokenizer is not None:
        fingerprint = "loaded:" + tokenizer_fingerprint(tokenizer)
    sources = read_sources(data)
    records = plan_records([len(s.rows) for s in sources], [s.config.weight for s in sources],
                           train_sources=len(data.datasets), validation_fraction=data.validation_fraction,
                           seed=seed)  # fmt: skip
    key = cache_key(data, seed, str(fingerprint), sources, records)
    root = data_cache_dir(data) / key
    prepared = PreparedData.load(root)
    reused = prepared is not None
    if prepared is not None:
        log.info("data: reusing the prepared dataset %s (no tokenization)", root)
    else:
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
        prepared = build(data, seed, tokenizer, sources, records, root=root, key=key, use_ray=use_ray,
                         ray_address=ray_address)  # fmt: skip
    log_summary(prepared)
    write_report(prepared, report_dir)
    check_rejected(prepared, data.max_rejected_fraction, report_dir)
    return PrepareOutcome(prepared, reused, time.monotonic() - started)


def data_cache_dir(data: DataConfig) -> Path:
    """Where prepared datasets live: $RAYFT_DATA_CACHE, else data.cache_dir, else <cache>/datasets."""
    configured = os.environ.get("RAYFT_DATA_CACHE") or data.cache_dir
    return Path(configured).expanduser() if configured else cache_root() / "datasets"


def read_sources(data: DataConfig) -> list[Source]:
    """Read the training then the validation datasets, resolve their formats, and serialise rows as JSON."""
    from rayft.data.sources import read_table, source_name

    sources = []
    for ds in [*data.datasets, *data.validation_datasets]:
        table = read_table(ds)
        fmt = resolve_format(ds, table.column_names)
        name = source_name(ds)
        log.info("data: %s: %d rows, format %s", name, table.num_rows, fmt.describe())
        sources.append(Source(ds, name, fmt, _json_rows(table)))
    return sources


def _json_rows(table: pa.Table) -> list[str]:
    return [json.dumps(row, sort_keys=True, ensure_ascii=False, default=str) for row in table.to_pylist()]


def plan_records(
    sizes: Sequence[int], weights: Sequence[float], *, train_sources: int, validation_fraction: float, seed: int
) -> list[Record]:
    """Which rows become training and validation examples, in order (a pure planner).

    The first ``train_sources`` sources are training data: each first holds out
    ``validation_fraction`` of its rows (when no validation source follows), then contributes
    rows in proportion to its weight (sampling without replacement, repeating when a weight asks
    for more rows than it has); the mixture is shuffled by ``seed``. Sample ids number training
    then validation examples.
    """
    rng = random.Random(seed)
    held_out = len(sizes) == train_sources
    train_pool: list[list[tuple[int, int]]] = []
    validation: list[tuple[int, int]] = []
    for source, size in enumerate(sizes):
        rows = [(source, r) for r in range(size)]
        if source >= train_sources:
            validation.extend(rows)
            continue
        rng.shuffle(rows)
        cut = round(size * validation_fraction) if held_out else 0
        validation.extend(sorted(rows[:cut]))
        train_pool.append(rows[cut:])
    train = _mix(train_pool, weights[:train_sources], rng)
    return [Record(i, "train", s, r) for i, (s, r) in enumerate(train)] + [
        Record(len(train) + i, "validation", s, r) for i, (s, r) in enumerate(validation)
    ]


def _mix(pools: list[list[tuple[int, int]]], weights: Sequence[float], rng: random.Random) -> list[tuple[int, int]]:
    if len(pools) == 1:
        return pools[0]
    total = sum(len(p) for p in pools)
    mixed: list[tuple[int, int]] = []
    for pool, weight in zip(pools, weights, strict=True):
        want = round(total * weight / sum(weights))
        if pool:
            copies, extra = divmod(want, len(pool))
            mixed.extend(pool * copies + rng.sample(pool, extra))
    rng.shuffle(mixed)
    return mixed


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of everything in the tokenizer that changes token ids: vocabulary, merges, specials, template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    extra = json.dumps([tokenizer.chat_template, tokenizer.eos_token, tokenizer.pad_token, type(tokenizer).__name__])
    return hashlib.sha256((body + extra).encode()).hexdigest()


def tokenizer_files_fingerprint(model: ModelConfig) -> str | None:
    """A hash of the tokenizer's files when the model is a local directory (or a converted built-in).

    Lets a cached preparation be found without importing transformers (seconds). None when the
    tokenizer is not a plain local directory (Hub id, GGUF, remote code): then it is loaded and
    hashed by :func:`tokenizer_fingerprint`.
    """
    from importlib.metadata import version

    from rayft.models.loading import model_location
    from rayft.models.registry import CHATML_TEMPLATE

    if model.trust_remote_code or model.gguf_file:
        return None
    location, kwargs = model_location(model)
    directory = Path(location)
    if kwargs or not directory.is_dir():
        return None
    files = [directory / name for name in TOKENIZER_FILES if (directory / name).is_file()]
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"\n{path.name}\n".encode())
        digest.update(path.read_bytes())
    # load_tokenizer falls back to CHATML_TEMPLATE, and the libraries decide how the files are read.
    extra = [model.chat_template, CHATML_TEMPLATE, version("transformers"), version("tokenizers")]
    digest.update(json.dumps(extra).encode())
    return "files:" + digest.hexdigest()


def cache_key(
    data: DataConfig, seed: int, tokenizer_hash: str, sources: Sequence[Source], records: Sequence[Record]
) -> str:
    """The content key: the selected rows, their formats, the tokenizer and the settings that shape the output."""
    settings = data.model_dump(mode="json", include={"datasets", "validation_datasets", "max_seq_length",
                                                     "overlong", "train_on_prompt", "packing"})  # fmt: skip
    for entry in (*settings["datasets"], *settings["validation_datasets"]):
        entry.pop("max_rows", None)  # the rows themselves are hashed below
    digest = hashlib.sha256()
    header = {
        "version": PREPARE_VERSION,
        "seed": seed,
        "settings": settings,
        "formats": [s.format.describe() for s in sources],
        "tokenizer": tokenizer_hash,
    }
    digest.update(json.dumps(header, sort_keys=True).encode())
    for record in records:
        digest.update(f"\n{record.split}:{record.source}:".encode())
        digest.update(sources[record.source].rows[record.row].encode())
    return digest.hexdigest()[:24]


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
) -> PreparedData:
    """Tokenize every record, pack or not, and write the cache directory atomically."""
    import pyarrow as pa

    from rayft.data.tokenize import TextTokenizer, TokenizeJob

    job = TokenizeJob(
        TextTokenizer.from_hf(tokenizer),
        tuple((s.config, s.format) for s in sources),
        data.max_seq_length,
        data.overlong,
        data.train_on_prompt,
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
    units = {name: make_units(examples, data.packing, data.max_seq_length, seed) for name, examples in splits.items()}
    stats = compute_stats(rows, records, sources, units, data)
    return write_prepared(root, key, units=units, rejected=rejected, stats=stats, data=data)


def tokenize_in_process(job: TokenizeJob, inputs: pa.Table) -> pa.Table:
    """Tokenize in this process, batch by batch."""
    import pyarrow as pa

    from rayft.data.tokenize import as_table

    parts = [
        as_table(job(inputs.slice(start, BATCH_ROWS).to_pydict())) for start in range(0, inputs.num_rows, BATCH_ROWS)
    ]
    return pa.concat_tables(parts)


def tokenize_on_ray(job: TokenizeJob, inputs: pa.Table, address: str | None = None) -> pa.Table:
    """Tokenize with Ray Data ``map_batches`` tasks across the cluster's CPUs, one block of rows each.

    Uses the Ray already initialised in this process, else joins ``address`` or starts a local one.
    Tasks run in Ray's pooled worker processes; each process deserialises the job (the tokenizer)
    once per job content and keeps it for later blocks (see :func:`rayft.data.tokenize.tokenize_batch`).
    """
    from rayft.runtime import ray_runtime

    with ray_runtime(address):
        return _tokenize_on_ray(job, inputs)


def block_rows(num_rows: int, num_cpus: int, *, tasks_per_cpu: int = 4, smallest: int = BATCH_ROWS) -> int:
    """Rows per block (one tokenization task each): about ``tasks_per_cpu`` tasks per CPU, so every
    CPU stays busy until close to the end while each task stays long enough to amortise its fixed
    cost (a task and its arguments and result crossing the object store), and never under ``smallest``."""
    return max(smallest, -(-num_rows // max(1, num_cpus * tasks_per_cpu)))


def _tokenize_on_ray(job: TokenizeJob, inputs: pa.Table) -> pa.Table:
    """A Ray Data job: the rows in blocks of :func:`block_rows`, one ``map_batches`` task of 1 CPU each.

    Ray Data's operator resource reservation is off for this dataset: with it (Ray 2.60) the
    executor gave the tokenize operator a budget of 0 CPUs until its first task's output size was
    known, then handed a freed CPU over one executor tick (~0.1-0.2 s) late; measured on 2 CPUs, the
    CPUs were busy 71-74% of the job with it and 94-96% without it.
    """
    import pyarrow as pa
    import ray

    from rayft.data.tokenize import job_key, tokenize_batch

    size = block_rows(inputs.num_rows, int(ray.cluster_resources().get("CPU", 1)))
    # Slices share the input's buffers; Ray's Arrow serializer sends each block's own rows only.
    blocks = [inputs.slice(start, size) for start in range(0, inputs.num_rows, size)]
    source = ray.data.from_arrow(blocks)
    source.context.op_resource_reservation_enabled = False  # this dataset's copy of the context only
    # The job's ref goes in a list so that Ray passes the ref, not the job: a worker that already
    # holds this job (same content key) skips fetching it.
    dataset = source.map_batches(
        tokenize_batch,
        fn_kwargs={"job_key": job_key(job), "job_ref": [ray.put(job)]},
        batch_size=size,
        batch_format="pyarrow",
        num_cpus=1,
    )
    return pa.concat_tables(ray.get(dataset.to_arrow_refs()))


def collect_rejected(
    rows: Sequence[dict[str, Any]], records: Sequence[Record], sources: Sequence[Source], overlong: str
) -> list[dict[str, Any]]:
    """The report entries of the rejected rows; DataError at the first over-long row with ``overlong: error``."""
    rejected = []
    for row, record in zip(rows, records, strict=True):
        if not row["reason"]:
            continue
        source = sources[record.source].name
        if row["reason"] == "over_length" and overlong == "error":
            raise DataError(
                f"dataset {source!r} row {record.row}: {row['detail']} (data.overlong=error); raise "
                "data.max_seq_length, or set data.overlong=truncate or drop"
            )
        rejected.append({"row_id": f"{source}:{record.row}", "source": source, "row": record.row,
                         "split": record.split, "reason": row["reason"], "detail": row["detail"]})  # fmt: skip
    return rejected


def make_units(examples: list[dict[str, Any]], packing: bool, max_seq_length: int, seed: int) -> list[dict[str, Any]]:
    """Training units: one per example, or packs of examples (in a seeded order)."""
    if not packing:
        return [
            make_unit(e["input_ids"], e["labels"], list(range(len(e["input_ids"]))), [e["sample_id"]]) for e in examples
        ]
    packs = plan_packs([len(e["input_ids"]) for e in examples], max_seq_length)
    random.Random(seed).shuffle(packs)
    return build_units(examples, packs)


def compute_stats(
    rows: Sequence[dict[str, Any]],
    records: Sequence[Record],
    sources: Sequence[Source],
    units: dict[str, list[dict[str, Any]]],
    data: DataConfig,
) -> dict[str, Any]:
    """Row counts, rejections by reason, token length percentiles, truncation and padding efficiency."""
    import numpy as np

    accepted = [r for r in rows if not r["reason"]]
    lengths = np.asarray([r["length"] for r in accepted] or [0])
    train_tokens = sum(u["num_tokens"] for u in units["train"])
    stats: dict[str, Any] = {
        "formats": {s.name: s.format.describe() for s in sources},
        "rows_total": len(records),
        "rows": {name: sum(1 for r in records if r.split == name) for name in SPLITS},
        "examples": {name: sum(len(u["sample_ids"]) for u in units[name]) for name in SPLITS},
        "rejected_total": len(rows) - len(accepted),
        "rejected_by_reason": dict(Counter(r["reason"] for r in rows if r["reason"]).most_common()),
        "tokens_total": train_tokens,
        "label_tokens_total": sum(u["num_label_tokens"] for u in units["train"]),
        "length_percentiles": {f"p{q}": int(np.percentile(lengths, q)) for q in (50, 90, 99)}
        | {"max": int(lengths.max())},
        "truncated": sum(1 for r in accepted if r["truncated"]),
        "truncated_share": sum(1 for r in accepted if r["truncated"]) / max(len(accepted), 1),
    }
    if data.packing and units["train"]:
        stats["padding_efficiency"] = train_tokens / (len(units["train"]) * data.max_seq_length)
    return stats


def write_prepared(
    root: Path,
    key: str,
    *,
    units: dict[str, list[dict[str, Any]]],
    rejected: list[dict[str, Any]],
    stats: dict[str, Any],
    data: DataConfig,
) -> PreparedData:
    """Write the units, the rejected rows and the manifest (last) into a temp dir, then rename it to ``root``."""
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root.parent))
    except OSError as exc:
        raise StorageError(
            f"data cache: cannot write under {root.parent} ({exc.strerror}); set data.cache_dir or "
            "$RAYFT_DATA_CACHE to a writable directory"
        ) from exc
    try:
        staging.chmod(0o755)
        splits = {name: write_split(staging, root, name, units[name]) for name in SPLITS}
        _write_jsonl(staging / REJECTED_FILE, rejected)
        validation = splits["validation"] if splits["validation"].num_units else None
        prepared = PreparedData(key, str(root), splits["train"], validation, data.packing, data.max_seq_length, stats)
        (staging / MANIFEST).write_text(prepared.to_json())
        if PreparedData.load(root) is None:  # another process may have finished the same key first
            shutil.rmtree(root, ignore_errors=True)
            os.replace(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    loaded = PreparedData.load(root)
    assert loaded is not None  # just written or written by a concurrent preparer
    return loaded


def write_split(staging: Path, root: Path, name: str, units: list[dict[str, Any]]) -> PreparedSplit:
    """Write one split's units as parquet files; the recorded paths point into the final ``root``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32())),
        ("position_ids", pa.list_(pa.int32())), ("sample_ids", pa.list_(pa.int64())),
        ("num_tokens", pa.int32()), ("num_label_tokens", pa.int32()),
    ])  # fmt: skip
    (staging / name).mkdir()
    files = []
    for index, start in enumerate(range(0, len(units), ROWS_PER_FILE)):
        relative = f"{name}/part-{index:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(units[start : start + ROWS_PER_FILE], schema=schema), staging / relative)
        files.append(str(root / relative))
    return PreparedSplit(
        files=tuple(files),
        num_units=len(units),
        num_examples=sum(len(u["sample_ids"]) for u in units),
        num_tokens=sum(u["num_tokens"] for u in units),
        num_label_tokens=sum(u["num_label_tokens"] for u in units),
    )


def _write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def write_report(prepared: PreparedData, report_dir: Path | None) -> None:
    """Copy the rejected-rows report and the stats into ``report_dir`` (atomically, file by file)."""
    if report_dir is None:
        return
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        for name, text in (
            (REJECTED_FILE, (Path(prepared.root) / REJECTED_FILE).read_text(encoding="utf-8")),
            (
                "stats.json",
                json.dumps({"key": prepared.key, "root": prepared.root, **prepared.stats}, indent=2, sort_keys=True),
            ),
        ):
            temp = report_dir / f".{name}.tmp"
            temp.write_text(text, encoding="utf-8")
            os.replace(temp, report_dir / name)
    except OSError as exc:
        raise StorageError(f"data report: cannot write {report_dir} ({exc.strerror}); check its permissions") from exc


def check_rejected(prepared: PreparedData, max_fraction: float, report_dir: Path | None) -> None:
    """Stop with DataError when the rejected share passes ``max_fraction``, naming the top reasons."""
    total = max(int(prepared.stats["rows_total"]), 1)
    rejected = int(prepared.stats["rejected_total"])
    if rejected / total <= max_fraction:
        return
    reasons = "; ".join(f"{reason}: {count} ({REASONS.get(reason, reason)})"
                        for reason, count in top_reasons(prepared.stats)[:3])  # fmt: skip
    where = report_dir / REJECTED_FILE if report_dir else Path(prepared.root) / REJECTED_FILE
    raise DataError(
        f"data: {rejected} of {total} rows ({rejected / total:.1%}) were rejected, more than "
        f"data.max_rejected_fraction={max_fraction}. Top reasons: {reasons}. Every row is listed in {where}; "
        "fix the rows, the format/field_mapping, or max_seq_length, or raise data.max_rejected_fraction"
    )


def top_reasons(stats: dict[str, Any]) -> list[tuple[str, int]]:
    """Rejection reasons with their counts, most frequent first."""
    counts: dict[str, int] = stats["rejected_by_reason"]
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def log_summary(prepared: PreparedData) -> None:
    """Log the counts and token statistics of a prepared dataset."""
    stats = prepared.stats
    log.info(
        "data %s: %d train units (%d examples), %s validation units, %d rejected %s, %d train tokens, lengths %s, "
        "%.1f%% truncated%s",
        prepared.key, prepared.train.num_units, prepared.train.num_examples,
        prepared.validation.num_units if prepared.validation else 0, stats["rejected_total"],
        stats["rejected_by_reason"] or "", stats["tokens_total"], stats["length_percentiles"],
        100 * stats["truncated_share"],
        f", padding efficiency {stats['padding_efficiency']:.3f}" if "padding_efficiency" in stats else "",
    )  # fmt: skip
