"""Print pip's package sources as uv arguments: `make setup` installs with uv, which reads no pip configuration.

``python scripts/pip_sources.py`` prints ``--index-url``, ``--extra-index-url``, ``--find-links`` and
``--constraint`` arguments for what pip is configured with here (``pip config list``: its files and
``PIP_*`` variables), so that uv resolves from the same places and under the same caps as pip would. A
machine whose pip has no such setting prints nothing, and uv uses PyPI as pip would.
"""

from __future__ import annotations

import subprocess
import sys

# pip's option -> uv's; both take a whitespace-separated list in pip's configuration.
OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
# Later scopes override earlier ones, as in pip: its files (global, user, site), then the environment.
SCOPES = ("global", "user", "site", ":env:")


def pip_settings(listing: str) -> dict[str, str]:
    """The value pip uses for each option of OPTIONS, from the output of ``pip config list``."""
    found: dict[tuple[str, str], str] = {}
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        scope, _, option = key.rpartition(".")
        if option in OPTIONS and scope in SCOPES:
            found[scope, option] = value.strip().strip("'\"")
    return {option: value for scope in SCOPES for (found_scope, option), value in found.items() if found_scope == scope}


def uv_arguments(settings: dict[str, str]) -> list[str]:
    """uv's arguments for pip's settings (one flag per listed value)."""
    return [arg for option, value in settings.items() for item in value.split() for arg in (OPTIONS[option], item)]


def main() -> int:
    """Print the arguments on one line (pip splits each setting on whitespace, so no value holds a space)."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    print(" ".join(uv_arguments(pip_settings(listing))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
