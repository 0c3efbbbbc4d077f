"""Where the tests' time goes: each fixture's set-up and each test phase, one JSON line apiece.

On when RAYFT_TEST_TIMINGS names a file (each pytest-xdist worker appends to it); off otherwise.
``python -m tests.support.timings FILE`` prints the slowest fixtures, tests and files from it;
``--write-seconds`` also records each file's seconds in ``file_seconds.json`` (tests.support.ordering).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ENV = "RAYFT_TEST_TIMINGS"


def _record(**fields: Any) -> None:
    path = os.environ.get(ENV)
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({**fields, "worker": worker, "end": time.time()}) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[None]:
    """Time one fixture's set-up (a session or module fixture once, where its first user asks)."""
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    if seconds >= 0.05:
        _record(kind="fixture", name=fixturedef.argname, scope=fixturedef.scope, nodeid=request.node.nodeid,
                seconds=round(seconds, 3))  # fmt: skip


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One line per test phase (setup, call, teardown): the figures of ``--durations=0``. Under
    pytest-xdist the worker that ran the test records it; the controller, which hears of the same
    report (``report.node`` names the worker), does not again."""
    if getattr(report, "node", None) is not None:
        return
    _record(kind="phase", name=report.when, nodeid=report.nodeid, seconds=round(report.duration, 3),
            outcome=report.outcome)  # fmt: skip


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def per_test(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds of each test (its set-up, call and teardown) in ``rows``."""
    tests: dict[str, float] = defaultdict(float)
    for row in rows:
        if row["kind"] == "phase":
            tests[row["nodeid"]] += row["seconds"]
    return tests


def per_file(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds of each test file in ``rows`` (the sum of its tests')."""
    files: dict[str, float] = defaultdict(float)
    for nodeid, seconds in per_test(rows).items():
        files[nodeid.split("::")[0]] += seconds
    return files


def summary(path: Path, top: int = 25) -> str:
    """The slowest fixtures, tests and files recorded in ``path``."""
    rows = _rows(path)
    tests, files = per_test(rows), per_file(rows)
    fixtures = sorted((r for r in rows if r["kind"] == "fixture"), key=lambda r: -r["seconds"])[:top]
    lines = [f"{len(tests)} tests, {sum(tests.values()):.0f} s in all", "", "slowest fixtures (set-up):"]
    lines += [f"{r['seconds']:8.1f}s {r['scope']:8} {r['name']}  ({r['nodeid']})" for r in fixtures]
    lines += ["", "slowest tests (set-up + call + teardown):"]
    lines += [f"{s:8.1f}s {n}" for n, s in sorted(tests.items(), key=lambda kv: -kv[1])[:top]]
    lines += ["", "files:"] + [f"{s:8.1f}s {n}" for n, s in sorted(files.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def write_seconds(path: Path) -> None:
    """Record the seconds of each file measured in ``path`` in the ordering's ``file_seconds.json``."""
    from tests.support.ordering import SECONDS_FILE

    table = json.loads(SECONDS_FILE.read_text(encoding="utf-8"))
    table.update({name: round(seconds) for name, seconds in per_file(_rows(path)).items()})
    ordered = dict(sorted(table.items(), key=lambda kv: -kv[1]))
    SECONDS_FILE.write_text(json.dumps(ordered, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    print(summary(Path(sys.argv[1])))
    if "--write-seconds" in sys.argv[2:]:
        write_seconds(Path(sys.argv[1]))
