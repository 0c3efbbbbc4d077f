"""Set-up built once per pytest run, shared by its pytest-xdist workers (a tiny model, prepared units,
a reference training run): the first worker to ask builds it, the others wait for it and read it.

Each worker would otherwise build its own copy of a session fixture; the copies are equal (they are
built from seeds), so one serves all. The workers of one run share the parent of their base temp
directories, where the result (named with the run's id) and a lock live: pytest-xdist's recipe for such
fixtures. Without pytest-xdist (a pytest that a test starts included) the fixture is built as before,
in this process's temp directory.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def once_per_run(
    config: pytest.Config, tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], T],
    *, dump: Callable[[T], str], load: Callable[[str], T],
) -> T:  # fmt: skip
    """``build(directory)`` once for all the workers of this run; ``dump`` and ``load`` carry its result
    (text) from the worker that built it to the others. A build that failed is tried again by the next."""
    worker_input = getattr(config, "workerinput", None)  # set in pytest-xdist's workers only
    if worker_input is None:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent
    done = shared / f"{name}-{worker_input['testrunuid']}.built"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the build raises
        if not done.is_file():
            result = build(tmp_path_factory.mktemp(name))
            done.write_text(dump(result), encoding="utf-8")
            return result
    return load(done.read_text(encoding="utf-8"))
