"""The one atomic text writer used for configs, reports and summaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.errors import StorageError
from rayft.files import write_text_atomic


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
