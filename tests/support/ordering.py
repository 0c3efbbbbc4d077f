"""The integration and chaos files in the order that ends soonest on pytest-xdist workers: longest first.

``make test`` runs those tiers with ``--dist loadfile --no-loadscope-reorder``: each worker takes the next
whole file of the collection as it runs short of work. Given the longest files first, the last ones
handed out are short, and no worker is left running a long file alone while the other idles (the
longest-processing-time-first rule). pytest-xdist's own reorder sorts files by their number of tests,
which put files of one or two long tests (a sweep, a chaos run) last.

A file's seconds come from ``file_seconds.json`` (measured on a 2-core machine with two workers, written
by ``python -m tests.support.timings RUN.jsonl --write-seconds``); a file not in it counts
:data:`SECONDS_PER_TEST` per test. Unit tests keep their order (the unit tier distributes test by test).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

SECONDS_FILE = Path(__file__).with_name("file_seconds.json")
SECONDS_PER_TEST = 8.0
"""A file's cost per test where the file has no measured seconds: about the tiers' mean."""
TIERS = ("integration", "chaos")


def file_seconds(items: list[pytest.Item]) -> dict[str, float]:
    """The expected seconds of each integration or chaos file among ``items``."""
    measured: dict[str, float] = json.loads(SECONDS_FILE.read_text(encoding="utf-8"))
    counts = Counter(item.nodeid.split("::")[0] for item in items if _in_tiers(item))
    return {path: measured.get(path, SECONDS_PER_TEST * count) for path, count in counts.items()}


def _in_tiers(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(tier) for tier in TIERS)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest integration and chaos files first (each file's tests together, in their own order);
    other tests after them, as collected."""
    seconds = file_seconds(items)
    position = {id(item): index for index, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[float, int]:
        return (-seconds.get(item.nodeid.split("::")[0], 0.0) if _in_tiers(item) else 0.0, position[id(item)])

    items.sort(key=key)
