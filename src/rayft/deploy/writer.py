"""Writing rendered manifests as YAML: one stream for stdout, or one file per object."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rayft.errors import StorageError
from rayft.security import redact


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the config in the ConfigMap) as literal blocks, so they read as YAML."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(manifests: Sequence[dict[str, Any]]) -> str:
    """The manifests as one multi-document YAML stream, ready for ``kubectl apply -f -``."""
    return yaml.dump_all(manifests, Dumper=_Dumper, sort_keys=False, explicit_start=True, allow_unicode=True)


def write_manifests(manifests: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """One file per object, ``NN-kind-name.yaml`` numbered in apply order; returns the paths."""
    paths = []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for index, manifest in enumerate(manifests):
            name = f"{index:02d}-{manifest['kind'].lower()}-{manifest['metadata']['name']}.yaml"
            path = out_dir / name
            path.write_text(redact(to_yaml([manifest])), encoding="utf-8")
            paths.append(path)
    except OSError as exc:
        raise StorageError(f"--output: cannot write {out_dir} ({exc.strerror}); choose a writable directory") from exc
    return paths
