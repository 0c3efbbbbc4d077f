"""Reading what W&B wrote in offline mode (``run-<id>.wandb``): the history rows, the config and
the tags, for tests that check a run from its files.

The file is a LevelDB-style log (32 KiB blocks of records with a 7-byte header: CRC, length, type)
after a 7-byte W&B header; each record is a ``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> list[bytes]:
    """The records of the log (fragments joined)."""
    records: list[bytes] = []
    pending = b""
    pos = _HEADER  # the W&B header (":W&B", magic, version) takes the first 7 bytes
    while pos + _HEADER <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _HEADER:
            pos += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0 and length == 0:
            pos += left_in_block
            continue
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            records.append(pending + chunk)
    return records


@dataclass
class OfflineRun:
    """What one offline run file holds."""

    run_id: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)


def read_offline_run(path: Path) -> OfflineRun:
    """Parse a ``run-<id>.wandb`` file."""
    from wandb.proto import wandb_internal_pb2

    run = OfflineRun()
    for payload in _payloads(path.read_bytes()):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id = record.run.run_id
            run.tags = list(record.run.tags)
            run.config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            run.config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            if record.history.HasField("step"):
                row["_step"] = record.history.step.num
            run.history.append(row)
    return run
