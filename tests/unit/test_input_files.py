"""Why a file a user names cannot be read, said as it is: missing, a directory, a link to nothing, a link
loop (rayft.files.unreadable_file); the config file and the serve keys file say it that way."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError
from rayft.files import unreadable_file


def test_each_reason_a_named_file_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert unreadable_file(tmp_path / "file") is None
    assert unreadable_file(tmp_path / "missing") == "does not exist"
    assert unreadable_file(tmp_path / "dir") == "is a directory, not a file"
    assert unreadable_file(tmp_path / "dangling") == f"is a symbolic link to nothing ({tmp_path / 'gone'})"
    assert unreadable_file(tmp_path / "loop") == "is a symbolic link loop"


def test_a_config_path_that_is_a_directory_is_named_as_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Config file '.*' is a directory, not a file; give the YAML file"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match=r"Config file '.*nowhere.yaml' does not exist; check the path"):
        load_config(tmp_path / "nowhere.yaml")
