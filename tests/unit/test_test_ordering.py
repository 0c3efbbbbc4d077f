"""The integration and chaos files go to pytest-xdist's workers longest first (each file's tests kept
together, in their order); unit tests keep their place after them. The timings plugin records each
test phase and fixture, and its summary sums them per file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ordering, timings


@dataclass
class FakeItem:
    """What the ordering reads of a collected test: its node id and its tier marker."""

    nodeid: str
    tier: str | None = None

    def get_closest_marker(self, name: str) -> object | None:
        return name if name == self.tier else None


def test_longest_files_first_unit_tests_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "file_seconds.json"
    table.write_text(json.dumps({"tests/integration/test_b.py": 100, "tests/chaos/test_c.py": 300}))
    monkeypatch.setattr(ordering, "SECONDS_FILE", table)
    items = [
        FakeItem("tests/unit/test_u.py::test_1"),
        FakeItem("tests/chaos/test_c.py::test_1", "chaos"),
        FakeItem("tests/integration/test_a.py::test_1", "integration"),  # not measured: 8 s a test
        FakeItem("tests/integration/test_a.py::test_2", "integration"),
        FakeItem("tests/integration/test_b.py::test_2", "integration"),
        FakeItem("tests/integration/test_b.py::test_1", "integration"),
        FakeItem("tests/unit/test_u.py::test_0"),
    ]
    assert ordering.file_seconds(items) == {  # type: ignore[arg-type]
        "tests/chaos/test_c.py": 300, "tests/integration/test_b.py": 100, "tests/integration/test_a.py": 16.0,
    }  # fmt: skip
    ordering.pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [
        "tests/chaos/test_c.py::test_1",
        "tests/integration/test_b.py::test_2",
        "tests/integration/test_b.py::test_1",
        "tests/integration/test_a.py::test_1",
        "tests/integration/test_a.py::test_2",
        "tests/unit/test_u.py::test_1",
        "tests/unit/test_u.py::test_0",
    ]


def test_every_measured_file_exists() -> None:
    """A renamed or removed file would keep a stale entry: the table names only files that exist."""
    table = json.loads(ordering.SECONDS_FILE.read_text(encoding="utf-8"))
    repo = Path(ordering.__file__).resolve().parents[2]
    assert [name for name in table if not (repo / name).is_file()] == []


def test_timings_sum_each_file_and_rewrite_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run.jsonl"
    monkeypatch.setenv(timings.ENV, str(run))
    rows = [("tests/integration/test_a.py::t1", "setup", 30.0), ("tests/integration/test_a.py::t1", "call", 5.5),
            ("tests/integration/test_a.py::t2", "call", 2.0), ("tests/chaos/test_c.py::t", "call", 7.0)]  # fmt: skip
    for nodeid, phase, seconds in rows:
        timings._record(kind="phase", name=phase, nodeid=nodeid, seconds=seconds, outcome="passed")
    timings._record(kind="fixture", name="ray_session", scope="session", nodeid="x", seconds=12.5)
    parsed = timings._rows(run)
    assert timings.per_file(parsed) == {"tests/integration/test_a.py": 37.5, "tests/chaos/test_c.py": 7.0}
    text = timings.summary(run)
    assert "3 tests, 44 s in all" in text and "12.5s session  ray_session" in text
    table = tmp_path / "file_seconds.json"
    table.write_text(json.dumps({"tests/integration/test_a.py": 99, "tests/integration/test_z.py": 20}))
    monkeypatch.setattr(ordering, "SECONDS_FILE", table)
    timings.write_seconds(run)
    assert json.loads(table.read_text()) == {
        "tests/integration/test_a.py": 38, "tests/integration/test_z.py": 20, "tests/chaos/test_c.py": 7,
    }  # fmt: skip
    assert list(json.loads(table.read_text())) == [
        "tests/integration/test_a.py", "tests/integration/test_z.py", "tests/chaos/test_c.py",
    ]  # fmt: skip
