"""Small tmpfs mounts for tests of storage failures: a read-only directory and a full disk, made real
(not mocked) where this process may mount (root on Linux); elsewhere the test that needs one is skipped."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(path: Path, *, size_kib: int = 1024, readonly: bool = False) -> Iterator[Path]:
    """Mount a tmpfs of ``size_kib`` at ``path`` (created) for the body, then unmount it.

    Skips the calling test when mounting is not allowed here.
    """
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size_kib}k" + (",ro" if readonly else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"needs a tmpfs mount (root on Linux): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
