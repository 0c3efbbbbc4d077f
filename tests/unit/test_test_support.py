"""The tests' own machinery: the integration and chaos files go to pytest-xdist's workers longest first
(each file's tests kept together, in their order), unit tests keep their place after them; the timings
plugin records each test phase and fixture once and sums them per file; a fixture built once per run
is built by the first worker and read by the others."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ordering, timings
from tests.support.once import SHARED_ENV, once_per_run


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


@dataclass
class FakeReport:
    """A test phase's report; pytest-xdist's controller gets each with ``node`` set to the worker."""

    nodeid: str
    when: str
    duration: float
    outcome: str = "passed"
    node: object | None = None


def test_a_phase_is_recorded_once_under_xdist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run.jsonl"
    monkeypatch.setenv(timings.ENV, str(run))
    timings.pytest_runtest_logreport(FakeReport("t.py::a", "call", 3.0))  # type: ignore[arg-type]  # the worker
    timings.pytest_runtest_logreport(FakeReport("t.py::a", "call", 3.0, node="gw0"))  # type: ignore[arg-type]
    assert timings.per_test(timings._rows(run)) == {"t.py::a": 3.0}


@dataclass
class FakeConfig:
    """A pytest config: pytest-xdist's workers have ``workerinput`` (with the run's id), others not."""

    workerinput: dict[str, str] | None = None


@dataclass
class FakeTempFactory:
    """A worker's tmp_path_factory: its base temp directory sits in one directory per run."""

    base: Path

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True)

    def getbasetemp(self) -> Path:
        return self.base

    def mktemp(self, name: str) -> Path:
        path = self.base / name
        path.mkdir(parents=True)
        return path


def test_the_first_worker_builds_and_the_others_read_what_it_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SHARED_ENV, raising=False)
    built: list[Path] = []

    def build(directory: Path) -> Path:
        built.append(directory)
        (directory / "weights").write_text("w")
        return directory / "weights"

    run = {"testrunuid": "abc"}
    gw0, gw1 = (FakeTempFactory(tmp_path / "run" / f"popen-gw{i}") for i in range(2))
    first = once_per_run(FakeConfig(run), gw0, "model", build, dump=str, load=Path)  # type: ignore[arg-type]
    second = once_per_run(FakeConfig(run), gw1, "model", build, dump=str, load=Path)  # type: ignore[arg-type]
    assert first == second == tmp_path / "run" / "popen-gw0" / "model" / "weights" and len(built) == 1
    # another run (another id) builds again; a process that is no worker builds its own
    once_per_run(FakeConfig({"testrunuid": "def"}), FakeTempFactory(tmp_path / "run" / "popen-gw2"), "model", build,
                 dump=str, load=Path)  # type: ignore[arg-type]  # fmt: skip
    alone = once_per_run(FakeConfig(), FakeTempFactory(tmp_path / "alone"), "model", build, dump=str, load=Path)  # type: ignore[arg-type]
    assert len(built) == 3 and alone == tmp_path / "alone" / "model" / "weights"


def test_a_later_pytest_run_of_make_test_reads_what_an_earlier_one_built_while_it_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[Path] = []

    def build(directory: Path) -> Path:
        built.append(directory)
        (directory / "run").write_text("r")
        return directory / "run"

    monkeypatch.setenv(SHARED_ENV, str(tmp_path / "shared"))
    worker = FakeTempFactory(tmp_path / "integration" / "popen-gw1")
    first = once_per_run(FakeConfig({"testrunuid": "abc"}), worker, "ref", build, dump=str, load=Path)  # type: ignore[arg-type]
    alone = FakeTempFactory(tmp_path / "alone")
    second = once_per_run(FakeConfig(), alone, "ref", build, dump=str, load=Path)  # type: ignore[arg-type]
    assert first == second == tmp_path / "integration" / "popen-gw1" / "ref" / "run" and len(built) == 1
    shutil.rmtree(tmp_path / "integration")  # pytest removed the older run's temp directories
    third = once_per_run(FakeConfig(), alone, "ref", build, dump=str, load=Path)  # type: ignore[arg-type]
    assert third == tmp_path / "alone" / "ref" / "run" and len(built) == 2


def test_a_failed_build_is_tried_again_by_the_next_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHARED_ENV, raising=False)

    def fails(directory: Path) -> str:
        raise RuntimeError("no room")

    run = {"testrunuid": "abc"}
    with pytest.raises(RuntimeError, match="no room"):
        once_per_run(FakeConfig(run), FakeTempFactory(tmp_path / "popen-gw0"), "x", fails, dump=str, load=str)  # type: ignore[arg-type]
    again = once_per_run(FakeConfig(run), FakeTempFactory(tmp_path / "popen-gw1"), "x", str, dump=str, load=str)  # type: ignore[arg-type]
    assert again == str(tmp_path / "popen-gw1" / "x")
