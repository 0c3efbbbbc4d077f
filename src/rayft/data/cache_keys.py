"""Content keys of prepared datasets: where the cache lives, the tokenizer's fingerprint (from its
files when they are local, without importing transformers), the datasets' fingerprints (from their
files, streamed), and the key of exactly the data, tokenizer and settings that shape the output."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rayft.cache import cache_root
from rayft.config.data import DataConfig, DatasetConfig
from rayft.config.model import ModelConfig
from rayft.data.builtin import is_builtin
from rayft.data.read.sources import dataset_files
from rayft.models.loading import model_location
from rayft.models.registry import CHATML_TEMPLATE

# Bump when the output of the same inputs changes. 2: splits and mixtures from per-row hashes; keys
# from file fingerprints. 3: packing within windows of consecutive examples, one file per window.
# 4: rows encoded unpadded even when the tokenizer file saved a padding setting. 5: messages rows with
# tool use (calls, results, a tools column) and messages held as JSON text are trained instead of rejected.
PREPARE_VERSION = 5
_PIECE_BYTES = 1 << 20


TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "chat_template.jinja", "chat_template.json",
)  # fmt: skip


def data_cache_dir(data: DataConfig) -> Path:
    """Where prepared datasets live: $RAYFT_DATA_CACHE, else data.cache_dir, else <cache>/datasets."""
    configured = os.environ.get("RAYFT_DATA_CACHE") or data.cache_dir
    return Path(configured).expanduser() if configured else cache_root() / "datasets"


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
    data: DataConfig,
    seed: int,
    tokenizer_hash: str,
    fingerprints: Sequence[str],
    *,
    seq2seq: bool = False,
    pairs: Mapping[str, Any] | None = None,
    carry: Sequence[str] = (),
) -> str:
    """The content key: the datasets' fingerprints (:func:`dataset_fingerprint`), the tokenizer and the
    settings that shape the output (``seq2seq``: source/target pairs for an encoder-decoder, with their
    own length limits; ``pairs``: the preference-pair settings, for DPO, ORPO and SimPO alike, whose
    tokens are the same; ``carry``: the columns kept with each example for GRPO's rewards). Which rows
    are selected follows from these and the seed."""
    settings = data.model_dump(mode="json", include={"datasets", "validation_datasets", "max_seq_length",
                                                     "overlong", "train_on_prompt", "packing",
                                                     "validation_fraction"})  # fmt: skip
    if seq2seq:
        settings["seq2seq_limits"] = list(data.seq2seq_limits())
    if pairs is not None:
        settings["preference_pairs"] = dict(pairs)
    if carry:  # only then: the keys of every other preparation stay as they were
        settings["carried_columns"] = list(carry)
    header = {
        "version": PREPARE_VERSION,
        "seed": seed,
        "settings": settings,
        "datasets": list(fingerprints),
        "tokenizer": tokenizer_hash,
    }
    return hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()[:24]


def dataset_fingerprint(ds: DatasetConfig) -> str | None:
    """What a dataset's local files hold, from their names, sizes and streamed digests (see
    :func:`file_fingerprint`), with memory that does not grow with the files.

    A built-in set is fixed by its config (path, split, max_rows: in the settings). None for a URI
    or a Hub dataset: their rows are read and hashed instead (:func:`rows_fingerprint`).
    """
    if is_builtin(ds.path):
        return "builtin"
    files = dataset_files(ds)
    if files is None:
        return None
    base = Path(ds.path).expanduser()
    digest = hashlib.sha256()
    for path in files:
        name = path.relative_to(base).as_posix() if path != base else path.name
        digest.update(f"\n{name}\n{file_fingerprint(path)}".encode())
    return "files:" + digest.hexdigest()


def file_fingerprint(path: Path) -> str:
    """One file's size and a digest streamed in 1 MiB pieces. A Parquet file's digest covers its footer
    (schema, row groups, column statistics) only, so its modification time is part of the fingerprint
    too; every other file is hashed whole, so a copy or a touch of it keeps its fingerprint."""
    stat = path.stat()
    digest = hashlib.sha256()
    with path.open("rb", buffering=0) as file:
        if path.suffix.lower() == ".parquet" and stat.st_size >= 12:
            file.seek(stat.st_size - 8)
            footer_size = int.from_bytes(file.read(4), "little")
            file.seek(max(0, stat.st_size - 8 - footer_size))
            digest.update(file.read(footer_size + 8))
            return f"{stat.st_size}:{stat.st_mtime_ns}:footer:{digest.hexdigest()}"
        piece = bytearray(_PIECE_BYTES)  # one buffer, refilled: memory stays one piece whatever the file's size
        view = memoryview(piece)
        while count := file.readinto(piece):
            digest.update(view[:count])
    return f"{stat.st_size}:{digest.hexdigest()}"


def rows_fingerprint(rows: Iterable[str]) -> str:
    """A hash of a dataset's rows as read (for the datasets that are not local files)."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(row.encode())
        digest.update(b"\n")
    return "rows:" + digest.hexdigest()
