"""Checks of a LoRA adapter on disk, before anyone merges or ships it.

Peers ship adapters saved empty, as one rank's slice, or with B matrices still at their zero
initialisation. These checks read ``adapter_model.safetensors`` and ``adapter_config.json``
(no model needed) and return every problem found, each naming the file and what is wrong:

- the weights file is readable (a truncated file fails here) and holds LoRA tensors;
- every adapted module has both A (r x in) and B (out x r), with r from the config;
- every configured target module is adapted, and r matches the training config;
- no B matrix is all zero (the adapter would change nothing) and nothing is NaN or infinite.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft.runs import layout

_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight$")


@dataclass(frozen=True)
class AdapterSummary:
    """What an adapter holds: rank, adapted modules, and their (A, B) shapes."""

    r: int
    modules: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]
    num_parameters: int


def read_adapter_config(directory: Path) -> dict[str, Any]:
    """The parsed ``adapter_config.json`` (empty dict when missing or unreadable)."""
    try:
        return dict(json.loads((directory / layout.ADAPTER_CONFIG).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def _load_tensors(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path))


def check_adapter(
    directory: Path,
    *,
    expected_r: int | None = None,
    expected_targets: Sequence[str] | None = None,
    zero_b_allowed: bool = False,
) -> tuple[list[str], AdapterSummary | None]:
    """Problems of the adapter in ``directory`` (empty list: usable), and a summary when readable.

    Args:
        directory: Holds adapter_model.safetensors and adapter_config.json.
        expected_r: The rank the training config asked for (lora.r).
        expected_targets: Module names the training config listed (None for 'all-linear').
        zero_b_allowed: Accept lora_B left all zero (an adapter no update has moved yet).
    """
    import torch

    weights = directory / layout.ADAPTER_WEIGHTS
    config = read_adapter_config(directory)
    if not config:
        return [f"{directory / layout.ADAPTER_CONFIG}: missing or not valid JSON"], None
    try:
        tensors = _load_tensors(weights)
    except Exception as exc:  # safetensors raises its own error types for truncated headers and data
        return [f"{weights}: cannot be read ({type(exc).__name__}: {exc}); the file is truncated or corrupted"], None
    r = int(config.get("r", 0))
    problems: list[str] = []
    pairs: dict[str, dict[str, Any]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match:
            pairs.setdefault(match["module"], {})[match["part"]] = tensor
    if not pairs:
        return [f"{weights}: holds no LoRA tensors ({len(tensors)} tensors, none named *.lora_A/B.weight)"], None
    if expected_r is not None and r != expected_r:
        problems.append(f"{directory / layout.ADAPTER_CONFIG}: r={r} but the training config has lora.r={expected_r}")
    zero_b = []
    modules: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for module, parts in sorted(pairs.items()):
        if set(parts) != {"A", "B"}:
            problems.append(f"{weights}: {module} has only lora_{''.join(parts)} (both A and B are needed)")
            continue
        a, b = parts["A"], parts["B"]
        modules[module] = (tuple(a.shape), tuple(b.shape))
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != r or b.shape[1] != r:
            problems.append(
                f"{weights}: {module} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}, expected (r, in) and "
                f"(out, r) with r={r}"
            )
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            problems.append(f"{weights}: {module} holds NaN or infinite values")
        if not b.any():
            zero_b.append(module)
    if zero_b and not zero_b_allowed:
        problems.append(
            f"{weights}: lora_B of {len(zero_b)} of {len(pairs)} modules is all zero ({', '.join(zero_b[:3])}"
            f"{', ...' if len(zero_b) > 3 else ''}): the adapter changes nothing there (saved untrained or empty)"
        )
    problems += _missing_targets(config, expected_targets, set(pairs), weights)
    count = sum(t.numel() for t in tensors.values())
    return problems, AdapterSummary(r, modules, count)


def _covers(module: str, target: str) -> bool:
    return module == target or module.endswith("." + target)


def _missing_targets(
    config: dict[str, Any], expected: Sequence[str] | None, modules: set[str], weights: Path
) -> list[str]:
    problems = []
    configured = config.get("target_modules")
    targets = [configured] if isinstance(configured, str) else list(configured or [])
    # A regex target (PEFT allows one string as a full-match pattern) cannot be listed here.
    names = [t for t in targets if not isinstance(configured, str)]
    missing = [t for t in names if not any(_covers(m, t) for m in modules)]
    if missing:
        problems.append(f"{weights}: no adapter for configured target modules {missing[:5]} (saved partially?)")
    if expected is not None:
        absent = [t for t in expected if not any(_covers(m, t) for m in modules)]
        if absent:
            problems.append(f"{weights}: the training config targets {absent} but the adapter does not adapt them")
    return problems


def check_against_base(summary: AdapterSummary, base_model: Any) -> list[str]:
    """Problems of adapter shapes against the base model's linear layers (in and out features)."""
    problems = []
    named = dict(base_model.named_modules())
    for module, (a_shape, b_shape) in summary.modules.items():
        layer = named.get(module)
        weight = getattr(layer, "weight", None)
        if weight is None:
            problems.append(f"adapter module {module} does not exist in the base model (wrong base model?)")
            continue
        out_features, in_features = weight.shape[0], weight.shape[1]
        if a_shape[1] != in_features or b_shape[0] != out_features:
            problems.append(
                f"adapter module {module}: lora_A {a_shape} / lora_B {b_shape} do not fit the base layer "
                f"({out_features} x {in_features}); was it trained on another base model?"
            )
    return problems
