"""The lock on a run directory: a second driver is refused at once, a dead one's lock is taken over,
and the lock goes away however the driver ends. Real processes hold and contend for it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rayft
from rayft.config import load_config
from rayft.errors import RunStateError
from rayft.runs.lock import LockHolder, RunLock, lock_path, run_lock, stale_reason

HOLD = """
import sys
from pathlib import Path
from rayft.runs.lock import run_lock
with run_lock(Path(sys.argv[1]), command="rayft train demo.yaml"):
    print("locked", flush=True)
    sys.stdin.read()
"""
CONTEND = """
import sys
from pathlib import Path
from rayft.errors import RunStateError
from rayft.runs.lock import run_lock
try:
    with run_lock(Path(sys.argv[1]), command="rayft train"):
        print("acquired")
except RunStateError as exc:
    print(exc)
    sys.exit(3)
"""


def python(code: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(rayft.__file__).parents[1])}
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, text=True, **kwargs)  # type: ignore[call-overload,no-any-return]


@pytest.fixture
def holder(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A driver process holding the lock of ``tmp_path/demo`` until the test ends."""
    proc = python(HOLD, str(tmp_path / "demo"), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    yield proc
    proc.communicate("", timeout=30)


def test_a_second_driver_on_the_same_run_is_refused_at_once_naming_host_and_pid(tmp_path: Path, holder) -> None:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    contender = python(CONTEND, str(tmp_path / "demo"), stdout=subprocess.PIPE)
    out, _ = contender.communicate(timeout=60)
    assert contender.returncode == 3, out
    assert time.monotonic() - started < 20  # the time of a Python start-up, never a wait on the holder
    host = socket.gethostname()
    assert f"is in use by `rayft train demo.yaml` on host {host}, pid {holder.pid}" in out
    assert f"kill {holder.pid} on {host}" in out


def test_rayft_train_is_refused_before_any_work_while_another_driver_holds_the_run(tmp_path: Path, holder) -> None:  # type: ignore[no-untyped-def]
    from rayft.recipes import train

    cfg = load_config(None, [f"storage_path={tmp_path}", "name=demo"])
    with pytest.raises(RunStateError, match=rf"in use by .* pid {holder.pid} .*Wait for it to finish"):
        train.run(cfg)
    assert not (tmp_path / "demo" / "config.yaml").exists()


def test_a_refused_rayft_train_writes_nothing_into_the_first_drivers_log(tmp_path: Path, holder) -> None:  # type: ignore[no-untyped-def]
    log_file = tmp_path / "demo" / "logs" / "rayft.log"
    log_file.parent.mkdir(parents=True)
    log_file.write_text("the first driver's line\n", encoding="utf-8")
    config = tmp_path / "demo.yaml"
    config.write_text(f"name: demo\nstorage_path: {tmp_path}\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(Path(rayft.__file__).parents[1])}
    command = [sys.executable, "-m", "rayft", "train", str(config)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert f"pid {holder.pid}" in done.stderr and "Traceback" not in done.stderr
    assert log_file.read_text(encoding="utf-8") == "the first driver's line\n"


def test_rayft_run_and_rayft_sdg_are_refused_while_another_driver_holds_their_directory(tmp_path: Path, holder) -> None:  # type: ignore[no-untyped-def]
    from rayft.pipeline import runner as pipeline
    from rayft.recipes import sdg

    config = tmp_path / "pipeline.yaml"
    config.write_text(f"name: demo\nstorage_path: {tmp_path}\ntrain: {{}}\n")
    with pytest.raises(RunStateError, match=rf"is in use by .* pid {holder.pid}"):
        pipeline.run(load_config(str(config), []))
    with pytest.raises(RunStateError, match=rf"is in use by .* pid {holder.pid}"):
        sdg.run(load_config(None, []), output_dir=tmp_path / "demo")
    assert not (tmp_path / "demo").exists()


def test_the_lock_of_a_dead_process_is_taken_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = python("pass")
    dead.wait(timeout=30)
    stale = LockHolder(socket.gethostname(), dead.pid, "rayft train", time.time(), "t0")
    path = lock_path(tmp_path / "demo")
    path.write_text(json.dumps(stale.__dict__))
    with run_lock(tmp_path / "demo", command="rayft run"):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert f"pid {dead.pid} no longer exists on {socket.gethostname()}" in caplog.text
    assert not path.exists()


def test_a_lock_from_another_host_is_taken_over_only_once_its_heartbeat_stopped(tmp_path: Path) -> None:
    path = lock_path(tmp_path / "demo")
    path.write_text(json.dumps(LockHolder("node-7", 4242, "rayft run", time.time(), "t0").__dict__))
    with pytest.raises(RunStateError, match=r"on host node-7, pid 4242 .*last heartbeat 0 s ago"):
        RunLock(tmp_path / "demo", command="rayft run").acquire()
    os.utime(path, (time.time() - 120, time.time() - 120))
    with run_lock(tmp_path / "demo", command="rayft run"):
        assert json.loads(path.read_text())["host"] == socket.gethostname()


def test_the_lock_is_released_on_normal_exit_and_on_exception(tmp_path: Path) -> None:
    path = lock_path(tmp_path / "demo")
    with run_lock(tmp_path / "demo", command="rayft train"):
        assert path.is_file()
    assert not path.exists()
    with pytest.raises(ValueError, match="boom"), run_lock(tmp_path / "demo", command="rayft train"):
        raise ValueError("boom")
    assert not path.exists()
    with run_lock(tmp_path / "demo", command="rayft train"):  # and can be taken again
        pass


def test_the_holder_keeps_its_heartbeat(tmp_path: Path) -> None:
    lock = RunLock(tmp_path / "demo", command="rayft train", heartbeat_s=0.02)
    lock.acquire()
    try:
        os.utime(lock.path, (time.time() - 100, time.time() - 100))
        deadline = time.monotonic() + 10
        while time.time() - lock.path.stat().st_mtime > 50 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert time.time() - lock.path.stat().st_mtime < 50
    finally:
        lock.release()


def test_staleness_is_decided_by_pid_on_this_host_and_by_heartbeat_elsewhere() -> None:
    def held(host: str, pid: int) -> LockHolder:
        return LockHolder(host, pid, "rayft train", 0.0, "t")

    def reason(holder: LockHolder | None, age: float, alive: bool = True) -> str | None:
        return stale_reason(holder, age, host="me", pid=100, pid_alive=lambda _: alive, lease_s=60)

    assert reason(held("me", 7), 1e6) is None  # alive here: held, however old its heartbeat
    assert reason(held("me", 7), 0, alive=False) == "pid 7 no longer exists on me"
    assert "this process, which does not hold it" in (reason(held("me", 100), 0) or "")
    assert reason(held("other", 7), 59, alive=False) is None  # another host's pid is never checked here
    assert reason(held("other", 7), 61) == "no heartbeat from other for 61 s (lease 60 s)"
    assert reason(None, 5) is None  # being written
    assert reason(None, 61) == "unreadable, untouched for 61 s"
