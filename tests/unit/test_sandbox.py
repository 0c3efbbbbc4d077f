"""The process sandbox: each probe of untrusted code (a shell command, a fork bomb, an endless loop, a
10 GB allocation, a read outside the scratch directory, a socket, endless output) is contained and
answered with an error result, and the caller goes on to the next run."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from rayft.sandbox import Limits, resolve_isolation, run_python

QUICK = Limits(wall_s=4.0, cpu_s=30.0, memory_mb=512, processes=8, output_bytes=4096)
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the namespaces need root; without it the sandbox runs on rlimits")
MODES = [pytest.param("namespaces", marks=needs_root), "rlimits"]


def _uptime_s() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def _nobody_processes_started_before(uptime_s: float) -> list[int]:
    """The processes running as ``nobody`` (what sandboxed programs run as) that started before ``uptime_s``.

    Other tests on another pytest-xdist worker run sandboxes too, so a bare count of ``nobody``'s processes
    would see theirs; those that started after a run ended cannot be its forks."""
    out = subprocess.run(["ps", "-u", "65534", "-o", "pid="], capture_output=True, text=True, check=False).stdout
    ticks = os.sysconf("SC_CLK_TCK")
    started = []
    for pid in out.split():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended between ps and the read
        if int(fields[19]) / ticks < uptime_s:  # field 22 of stat: the start time, in clock ticks since boot
            started.append(int(pid))
    return started


def _wait_for_no_processes_started_before(uptime_s: float, timeout_s: float = 15.0) -> list[int]:
    """Wait until no ``nobody`` process that started before ``uptime_s`` is left (another worker's sandbox
    that overlapped the run ends within its own limits); what is left at the timeout."""
    deadline = time.monotonic() + timeout_s
    while (left := _nobody_processes_started_before(uptime_s)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize("mode", MODES)
def test_a_program_runs_in_its_scratch_directory_and_the_caller_gets_its_output(mode: str) -> None:
    result = run_python("import os, sys; print(os.getcwd() == os.environ['HOME'], sys.stdin.read())", stdin="in",
                        limits=QUICK, isolation=mode)  # fmt: skip
    assert (result.status, result.stdout, result.error) == ("ok", "True in\n", None)
    assert not Path(result.stdout).exists()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("probe", "status", "reason"),
    [
        ("while True: pass", "timeout", "timed out after 4 s"),
        ("b = bytearray(10 * 1024**3)", "error", "over the memory limit of 512 MiB"),
        ("import socket; socket.create_connection(('93.184.216.34', 80), timeout=2)", "error", "exit status 1"),
        ("while True: print('x' * 1000)", "output_limit", "output passed its limit of 4096 bytes"),
        ("raise ValueError('bad tool input')", "error", "ValueError: bad tool input"),
    ],
    ids=["endless-loop", "10GB-allocation", "socket", "endless-output", "exception"],
)
def test_each_probe_is_contained_and_answered_with_an_error(mode: str, probe: str, status: str, reason: str) -> None:
    result = run_python(probe, limits=QUICK, isolation=mode)
    assert result.status == status and result.error is not None and reason in result.error, result
    assert len(result.stdout) <= QUICK.output_bytes
    assert run_python("print(6 * 7)", limits=QUICK, isolation=mode).stdout == "42\n"  # the caller goes on


@pytest.mark.parametrize("mode", MODES)
def test_cpu_time_is_bounded_apart_from_the_wall_clock(mode: str) -> None:
    result = run_python("while True: pass", limits=Limits(wall_s=60.0, cpu_s=1.0), isolation=mode)
    # SIGXCPU at the soft limit; PID 1 of a namespace ignores it, and the hard limit's SIGKILL a second later ends it
    assert result.status == "error" and result.error in ("killed by the CPU time limit", "killed by SIGKILL (a limit "
                                                          "or the wall-clock timeout)"), result  # fmt: skip
    assert result.wall_s < 30.0


@needs_root
def test_a_shell_command_cannot_write_outside_the_scratch_directory() -> None:
    with tempfile.TemporaryDirectory() as outside:
        target = Path(outside) / "written"
        probe = f"import os, sys; sys.exit(os.system('echo pwned > {target}; touch /etc/rayft-probe') >> 8)"
        result = run_python(probe, limits=QUICK, isolation="namespaces")
        assert result.status == "error" and result.returncode != 0, result
        assert not target.exists() and not Path("/etc/rayft-probe").exists()


@needs_root
def test_the_world_writable_directories_are_private_to_the_run() -> None:
    places = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock"]
    probe = f"import os\nfor d in {places!r}:\n    open(os.path.join(d, 'rayft-probe-7c2'), 'w').write('x')"
    result = run_python(probe, limits=QUICK, isolation="namespaces")
    assert result.ok, result
    assert not [d for d in places if Path(d, "rayft-probe-7c2").exists()]


@needs_root
def test_a_file_outside_the_scratch_directory_cannot_be_read() -> None:
    with tempfile.TemporaryDirectory() as outside:
        secret = Path(outside) / "secret.txt"
        secret.write_text("canary-6d1f")
        result = run_python(f"print(open({str(secret)!r}).read())", limits=QUICK, isolation="namespaces")
    assert result.status == "error" and "canary" not in result.stdout, result
    assert "FileNotFoundError" in (result.error or "")


@needs_root
def test_a_fork_bomb_is_bounded_and_every_process_ends_with_the_run() -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = run_python(bomb, limits=QUICK, isolation="namespaces")
    ended = _uptime_s()
    assert result.status == "timeout", result
    # PID 1 of the namespace is gone, and with it every fork: none of the bomb's processes is left.
    assert _wait_for_no_processes_started_before(ended) == []
    assert run_python("print('next')", limits=QUICK).stdout == "next\n"


@needs_root
def test_the_network_is_absent_not_just_refused() -> None:
    probe = "import socket; print(socket.if_nameindex())"
    result = run_python(probe, limits=QUICK, isolation="namespaces")
    assert result.ok and result.stdout.strip() == "[(1, 'lo')]", result  # only a loopback, which is down


def test_no_variable_of_the_callers_environment_reaches_the_program(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYFT_TEST_TOKEN", "sk-canary-22")
    result = run_python("import os; print(sorted(os.environ))", limits=QUICK)
    assert result.ok and "RAYFT_TEST_TOKEN" not in result.stdout and "sk-canary" not in result.stdout


def test_isolation_follows_the_privileges() -> None:
    assert resolve_isolation("auto") == ("namespaces" if ROOT else "rlimits")
    assert resolve_isolation("rlimits") == "rlimits"


def test_a_program_runs_as_nobody_only_where_it_can_read_its_python() -> None:
    from rayft.sandbox import _world_readable

    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        inner = Path(top) / "lib"
        inner.mkdir()
        Path(top).chmod(0o755)
        inner.chmod(0o755)
        assert _world_readable(inner)
        Path(top).chmod(0o700)  # like /root, where a Python installation may live
        assert not _world_readable(inner)
    assert _world_readable(Path("/usr/bin")) and not _world_readable(Path("/no/such/dir"))
