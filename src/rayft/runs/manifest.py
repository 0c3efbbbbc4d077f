"""The completion marker of a checkpoint: written last, it lists every file with size and sha256.

A directory without a valid manifest is incomplete (a save was interrupted) and is never loaded.
A file whose size or checksum differs from the manifest is corrupted; the checkpoint is then
rejected with a message naming the file.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayft.files import replacing
from rayft.runs.layout import MANIFEST_FILE

FORMAT = "rayft-checkpoint/1"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileEntry:
    """Size and sha256 of one file of a checkpoint."""

    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a complete checkpoint holds: its step, metrics, lineage, and files."""

    step: int
    files: dict[str, FileEntry]
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0

    def to_json(self) -> str:
        """The manifest as JSON text."""
        return json.dumps(
            {
                "format": FORMAT,
                "step": self.step,
                "created_at": self.created_at,
                "metrics": self.metrics,
                "info": self.info,
                "files": {k: {"size": v.size, "sha256": v.sha256} for k, v in sorted(self.files.items())},
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse a manifest; raises ValueError if it is not one."""
        raw = json.loads(text)
        if raw.get("format") != FORMAT:
            raise ValueError(f"unknown checkpoint format {raw.get('format')!r} (expected {FORMAT!r})")
        files = {k: FileEntry(int(v["size"]), str(v["sha256"])) for k, v in raw["files"].items()}
        return cls(int(raw["step"]), files, raw.get("metrics", {}), raw.get("info", {}), raw.get("created_at", 0.0))


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def describe_files(root: Path) -> dict[str, FileEntry]:
    """Size and sha256 of every file under ``root`` except the manifest itself."""
    entries = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel != MANIFEST_FILE:
            entries[rel] = FileEntry(path.stat().st_size, sha256_file(path))
    return entries


def write_manifest(
    root: Path,
    step: int,
    metrics: dict[str, float] | None = None,
    info: dict[str, Any] | None = None,
    extra_files: dict[str, FileEntry] | None = None,
) -> Manifest:
    """Describe every file in ``root`` (plus ``extra_files`` written elsewhere, e.g. by other
    workers) and write the manifest last, atomically (write to a temp name, fsync, rename)."""
    files = {**describe_files(root), **(extra_files or {})}
    manifest = Manifest(step, files, dict(metrics or {}), dict(info or {}), time.time())
    with replacing(root / MANIFEST_FILE, sync=True) as handle:
        handle.write(manifest.to_json())
    return manifest


def read_manifest(root: Path) -> Manifest | None:
    """The manifest of a checkpoint directory, or None if it is missing or unreadable."""
    path = root / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        return Manifest.from_json(path.read_text(encoding="utf-8"))
    except (ValueError, KeyError, TypeError):
        return None


def verify_checkpoint(root: Path, *, checksums: bool = True) -> list[str]:
    """Problems that make a checkpoint unusable (empty list: complete and intact).

    Args:
        root: The checkpoint directory.
        checksums: Also compare sha256 (slower); sizes are always compared.
    """
    manifest = read_manifest(root)
    if manifest is None and (root / MANIFEST_FILE).exists():
        return [f"{root}: its {MANIFEST_FILE} cannot be read (the save was committed; its files cannot be verified)"]
    if manifest is None:
        return [f"{root}: no valid {MANIFEST_FILE} (the save did not complete)"]
    problems = []
    for rel, entry in manifest.files.items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{path}: listed in the manifest but missing")
        elif path.stat().st_size != entry.size:
            problems.append(f"{path}: size {path.stat().st_size} differs from the manifest's {entry.size}")
        elif checksums and sha256_file(path) != entry.sha256:
            problems.append(f"{path}: sha256 differs from the manifest (corrupted)")
    return problems
