"""Sequence packing: grouping examples into training units of at most ``max_seq_length`` tokens.

:func:`plan_packs` is a pure planner (first-fit decreasing, with a segment tree over the bins'
free space, so it runs in O(n log n)); preparation runs it within windows of examples and builds the
units with Arrow (:func:`rayft.data.windows.unit_table`); :func:`build_units` is the same from Python
lists, for tests and benchmarks: each pack's examples concatenated into one unit whose positions
restart at every example. The training step passes
``position_ids`` without an attention mask, and transformers derives a block-diagonal causal mask
from the restarts (see :mod:`rayft.data.collate`), so attention never crosses examples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rayft.data.prepared import IGNORE_INDEX


def plan_packs(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into bins of total length <= ``capacity``, first-fit decreasing.

    Ties are broken by index, so the plan is deterministic. Bins are returned in creation order,
    each listing its examples in the order they were placed.
    """
    if any(n > capacity or n <= 0 for n in lengths):
        bad = next(n for n in lengths if n > capacity or n <= 0)
        raise ValueError(f"cannot pack an example of {bad} tokens into sequences of {capacity}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    size = 1
    while size < max(len(lengths), 1):
        size *= 2
    tree = [0] * (2 * size)  # max free space per subtree; unopened bins have 0
    bins: list[list[int]] = []
    for index in order:
        need = lengths[index]
        if tree[1] >= need:
            node = 1
            while node < size:  # descend to the leftmost bin with enough room
                node = 2 * node if tree[2 * node] >= need else 2 * node + 1
            slot = node - size
        else:
            slot = len(bins)
            bins.append([])
            node = size + slot
            tree[node] = capacity
        bins[slot].append(index)
        tree[node] -= need
        node //= 2
        while node:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    return bins


def build_units(examples: Sequence[dict[str, Any]], packs: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
    """One unit per pack: ids and labels concatenated, positions restarting per example.

    Every example's first label is already IGNORE_INDEX (see :func:`rayft.data.tokenize.finish`),
    so no token is trained on a prediction made from the previous example.
    """
    units = []
    for pack in packs:
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        for index in pack:
            example = examples[index]
            ids.extend(example["input_ids"])
            labels.extend(example["labels"])
            positions.extend(range(len(example["input_ids"])))
        units.append(make_unit(ids, labels, positions, [examples[i]["sample_id"] for i in pack]))
    return units


def make_unit(ids: list[int], labels: list[int], positions: list[int], sample_ids: list[int]) -> dict[str, Any]:
    """A unit row as in :mod:`rayft.data.prepared`."""
    return {
        "input_ids": ids,
        "labels": labels,
        "position_ids": positions,
        "sample_ids": sample_ids,
        "num_tokens": len(ids),
        "num_label_tokens": sum(1 for label in labels if label != IGNORE_INDEX),
    }
