"""What a tracker receives besides metrics: the resolved config as dotted params, and tags."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from rayft.security import redact

# MLflow limits a param value to 6000 characters and a key to 250.
MAX_PARAM_VALUE = 6000
MAX_PARAM_KEY = 250
_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")


def flatten(tree: Any, prefix: str = "", *, index_lists: bool = False) -> dict[str, Any]:
    """A nested dict as ``{"a.b.c": leaf}``; lists stay leaves (as JSON), empty dicts too. With
    ``index_lists``, lists of dicts are walked with their index as the key (``pairs.0.p_value``)."""
    if isinstance(tree, list) and index_lists and tree and all(isinstance(x, dict) for x in tree):
        tree = {str(i): item for i, item in enumerate(tree)}
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}.", index_lists=index_lists))
        return out
    return {prefix.rstrip("."): tree}


def config_params(resolved_yaml: str) -> dict[str, str]:
    """The resolved config (as written by ``dump_config``, secrets already masked) flattened to
    dotted keys with string values, masked again and cut to the tracker's limits."""
    tree = yaml.safe_load(resolved_yaml) or {}
    params: dict[str, str] = {}
    for key, value in flatten(tree).items():
        text = value if isinstance(value, str) else json.dumps(value)
        params[_KEY_CHARS.sub("_", key)[:MAX_PARAM_KEY]] = redact(text)[:MAX_PARAM_VALUE]
    return params


def run_tags(version: str, lineage: dict[str, Any]) -> dict[str, str]:
    """Tags of a run: rayft's version, and each lineage entry (data cache key, stage fingerprints...)
    as ``rayft.<key>``."""
    tags = {"rayft.version": version}
    for key, value in flatten(lineage).items():
        if value is not None:
            tags[f"rayft.{_KEY_CHARS.sub('_', key)}"] = redact(str(value))[:MAX_PARAM_VALUE]
    return tags


def summary_metrics(summary: dict[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """A stage summary split into numeric metrics (booleans as 0/1) and string params."""
    metrics: dict[str, float] = {}
    params: dict[str, str] = {}
    for key, value in flatten(summary, index_lists=True).items():
        name = _KEY_CHARS.sub("_", key)[:MAX_PARAM_KEY]
        if isinstance(value, int | float):  # booleans too
            metrics[name] = float(value)
        elif value is not None:
            text = value if isinstance(value, str) else json.dumps(value)
            params[name] = redact(text)[:MAX_PARAM_VALUE]
    return metrics, params
