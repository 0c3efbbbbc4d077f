"""`make setup` installs with uv, which reads no pip configuration: scripts/pip_sources.py hands it
pip's indexes, find-links and constraints, the environment's value over the files', as pip does."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pip_sources", REPO / "scripts" / "pip_sources.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pip_settings_become_uv_arguments_with_the_environment_over_the_files() -> None:
    script = load_script()
    listing = (
        ":env:.default-timeout='180'\n"
        ":env:.find-links='/srv/env-wheels'\n"
        "global.cert='/etc/ssl/certs/ca.crt'\n"
        "global.constraint='/etc/pip/caps.txt'\n"
        "global.extra-index-url='file:///srv/a/simple file:///srv/b/simple'\n"
        "global.find-links='/srv/wheels'\n"
        "user.index-url='https://mirror.example/simple'\n"
    )
    settings = script.pip_settings(listing)
    assert settings == {
        "constraint": "/etc/pip/caps.txt",
        "extra-index-url": "file:///srv/a/simple file:///srv/b/simple",
        "find-links": "/srv/env-wheels",  # PIP_FIND_LINKS over the file's value
        "index-url": "https://mirror.example/simple",
    }
    assert script.uv_arguments(settings) == [
        "--constraint", "/etc/pip/caps.txt",
        "--extra-index-url", "file:///srv/a/simple", "--extra-index-url", "file:///srv/b/simple",
        "--find-links", "/srv/env-wheels",
        "--index-url", "https://mirror.example/simple",
    ]  # fmt: skip


def test_a_pip_without_settings_gives_uv_no_arguments(tmp_path: Path) -> None:
    """No configuration file (pip loads none when PIP_CONFIG_FILE is the null device), no PIP_* variable."""
    env = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "pip_sources.py")], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == ""
