"""Set-up built once per pytest run, shared by its pytest-xdist workers (a tiny model, prepared units,
a reference training run): the first worker to ask builds it, the others wait for it and read it.

Each worker would otherwise build its own copy of a session fixture; the copies are equal (they are
built from seeds), so one serves all. The workers of one run share the parent of their base temp
directories, where the result (named with the run's id) and a lock live: pytest-xdist's recipe for such
fixtures. Without pytest-xdist (a pytest that a test starts included) the fixture is built as before,
in this process's temp directory.

``make test`` runs pytest more than once (the integration and chaos tiers on two workers, then the
tests that must run alone); it names a directory in :data:`SHARED_ENV`, fresh for each ``make test``,
through which the later runs read what an earlier one built (the alone tier's reference run is the one
the chaos tier trained) instead of building it again.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

SHARED_ENV = "RAYFT_TEST_SHARED"
"""A directory shared by the pytest runs of one ``make test`` (see the module's docstring)."""


def once_per_run(
    config: pytest.Config, tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], T],
    *, dump: Callable[[T], str], load: Callable[[str], T],
) -> T:  # fmt: skip
    """``build(directory)`` once for all the workers of this run; ``dump`` and ``load`` carry its result
    (text) from the worker that built it to the others. A build that failed is tried again by the next."""
    worker_input = getattr(config, "workerinput", None)  # set in pytest-xdist's workers only
    if os.environ.get(SHARED_ENV):
        shared, done_name = Path(os.environ[SHARED_ENV]), f"{name}.built"
        shared.mkdir(parents=True, exist_ok=True)
    elif worker_input is not None:
        shared, done_name = tmp_path_factory.getbasetemp().parent, f"{name}-{worker_input['testrunuid']}.built"
    else:
        return build(tmp_path_factory.mktemp(name))
    done, where = shared / done_name, shared / f"{done_name}.in"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the build raises
        # What an earlier pytest run built is read only while its directory is there (pytest removes old ones).
        if not (done.is_file() and where.is_file() and Path(where.read_text(encoding="utf-8")).is_dir()):
            directory = tmp_path_factory.mktemp(name)
            result = build(directory)
            done.write_text(dump(result), encoding="utf-8")
            where.write_text(str(directory), encoding="utf-8")
            return result
    return load(done.read_text(encoding="utf-8"))
