"""Content keys of prepared datasets: where the cache lives, the tokenizer's fingerprint (from its
files when they are local, without importing transformers), and the key of exactly the rows,
formats, tokenizer and settings that shape the output."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.cache import cache_root
from rayft.config.data import DataConfig
from rayft.config.model import ModelConfig
from rayft.models.loading import model_location
from rayft.models.registry import CHATML_TEMPLATE

if TYPE_CHECKING:
    from rayft.data.sources import Source
    from rayft.data.split_plan import Record


PREPARE_VERSION = 1  # bump when the output of the same inputs changes


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
    sources: Sequence[Source],
    records: Sequence[Record],
    *,
    seq2seq: bool = False,
) -> str:
    """The content key: the selected rows, their formats, the tokenizer and the settings that shape the
    output (``seq2seq``: source/target pairs for an encoder-decoder, with their own length limits)."""
    settings = data.model_dump(mode="json", include={"datasets", "validation_datasets", "max_seq_length",
                                                     "overlong", "train_on_prompt", "packing"})  # fmt: skip
    if seq2seq:
        settings["seq2seq_limits"] = list(data.seq2seq_limits())
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
