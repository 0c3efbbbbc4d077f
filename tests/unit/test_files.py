"""rayft.files: the one place files and directories are written so that no reader sees half of one."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import rayft
from rayft.errors import StorageError
from rayft.files import replace_dir, replacing, staging_dir, temp_path, write_atomic, write_text_atomic
from rayft.syntax import parse

SRC = Path(rayft.__file__).parent

# Renames that are not a write of a file or directory into place, each with its reason.
OTHER_RENAMES = {
    "runs/lock.py",  # a dead process's lock file is moved aside before it is taken over
    "runs/store.py",  # an earlier output is kept under a dated name (move_aside)
    "runs/checkpoints.py",  # a committed checkpoint whose manifest cannot be read is set aside (set_aside)
}


def test_writes_then_replaces_leaving_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "report.json"
    assert write_text_atomic(target, "first") == target
    write_text_atomic(target, "second ü")
    assert target.read_text(encoding="utf-8") == "second ü"
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]


def test_a_failed_write_names_the_file_the_setting_and_the_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(StorageError, match=r"^storage_path: cannot write .*not-a-dir/x\.yaml .*; use another"):
        write_text_atomic(blocker / "x.yaml", "a", where="storage_path", fix="use another")
    with pytest.raises(StorageError, match=r"^cannot write .*; choose a writable directory$"):
        write_text_atomic(blocker / "x.yaml", "a")


def test_temporary_names_are_hidden_beside_the_target_and_carry_the_process_id(tmp_path: Path) -> None:
    assert temp_path(tmp_path / "a.json") == tmp_path / f".a.json.tmp-{os.getpid()}"
    assert temp_path(tmp_path / "final", "download") == tmp_path / f".final.download-{os.getpid()}"


def test_a_block_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "records" / "train.json"
    with replacing(target, sync=True) as handle:
        handle.write("old")
    with pytest.raises(RuntimeError, match="crash"), replacing(target) as handle:
        handle.write("half of the new")
        raise RuntimeError("crash")
    assert target.read_text(encoding="utf-8") == "old"
    assert [p.name for p in target.parent.iterdir()] == ["train.json"]


def test_write_atomic_hands_the_writer_a_temporary_path(tmp_path: Path) -> None:
    seen: list[Path] = []

    def write(path: Path) -> None:
        seen.append(path)
        path.write_bytes(b"PAR1")

    assert write_atomic(tmp_path / "data.parquet", write) == tmp_path / "data.parquet"
    assert seen == [temp_path(tmp_path / "data.parquet")]
    assert [p.name for p in tmp_path.iterdir()] == ["data.parquet"]


def test_replace_dir_puts_a_staged_directory_in_place_of_the_old_one(tmp_path: Path) -> None:
    target = tmp_path / "final"
    for content, sync in (("first", False), ("second", True)):
        staging = staging_dir(target)
        (staging / "model.safetensors").write_text(content)
        assert replace_dir(staging, target, sync=sync) == target
    assert [p.name for p in target.iterdir()] == ["model.safetensors"]
    assert (target / "model.safetensors").read_text() == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["final"]  # no staging or old directory is left


def test_a_staging_directory_left_by_a_crash_is_emptied(tmp_path: Path) -> None:
    left = staging_dir(tmp_path / "final")
    (left / "half.bin").write_text("x")
    assert list(staging_dir(tmp_path / "final").iterdir()) == []


def renames(path: Path) -> list[str]:
    """The calls in ``path`` that rename a file or directory: os.replace / os.rename, and
    Path.replace / Path.rename (one positional argument, unlike str.replace and dataclasses.replace)."""
    found = []
    for node in ast.walk(parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in ("replace", "rename"):
            continue
        if ast.unparse(node.func.value) == "os" or (len(node.args) == 1 and not node.keywords):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_writes_a_file_or_directory_into_place_by_itself() -> None:
    others = [
        call
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).as_posix() not in ("files.py", *OTHER_RENAMES)
        for call in renames(path)
    ]
    assert not others, "write through rayft.files (replacing, write_atomic, replace_dir):\n" + "\n".join(others)


def test_a_directory_published_once_keeps_the_first_writers_copy(tmp_path: Path) -> None:
    from rayft.files import publish_dir_once

    target = tmp_path / "units"
    first = staging_dir(target, "a")
    (first / "f").write_text("first")
    second = staging_dir(target, "b")
    (second / "f").write_text("second")
    assert publish_dir_once(first, target) is True
    assert publish_dir_once(second, target) is False
    assert (target / "f").read_text() == "first" and sorted(p.name for p in tmp_path.iterdir()) == ["units"]
