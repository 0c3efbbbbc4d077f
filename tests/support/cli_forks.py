"""The ``rayft`` command line run many times at the cost of one interpreter start.

A test of many commands that fail fast (tests/integration/test_bad_input_corpus.py) spent most of its
time starting Python and importing torch, transformers and pyarrow once per command. :class:`CliForks`
starts one process that imports them once; each command then runs in a fresh fork of it: its own
process, working directory, environment, stdout, stderr and exit code, as ``python -m rayft`` would
have them, with nothing left behind from the commands before it. A test that times a whole command,
Python's start included, still runs ``python -m rayft``.

Protocol: one JSON line per command on the server's stdin (argv, cwd, env to add), one JSON line back
(returncode, stdout, stderr) on the descriptor handed to it, so that nothing a command or an
import prints is mistaken for an answer.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

PRELOAD = ("rayft.cli.main", "torch", "transformers", "pyarrow", "pyarrow.parquet", "pyarrow.csv", "rayft.config")
"""What most commands import before they fail; a command imports the rest in its own fork."""


class CliForks:
    """A server process that runs ``rayft ARGV`` in a fork of itself per call (see the module's docstring)."""

    def __init__(self, env: dict[str, str], timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s
        read, self._answers_fd = os.pipe()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.cli_forks", str(self._answers_fd)],
            stdin=subprocess.PIPE, env=env, pass_fds=(self._answers_fd,), text=True,
        )  # fmt: skip
        os.close(self._answers_fd)
        self._answers = os.fdopen(read, encoding="utf-8")
        self._lock = threading.Lock()

    def run(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``rayft ARGV`` in ``cwd`` with ``env`` added to the server's environment."""
        assert self._process.stdin is not None
        with self._lock:
            self._process.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd), "env": env or {}}) + "\n")
            self._process.stdin.flush()
            line = self._answers.readline()
        if not line:
            raise RuntimeError(f"the rayft fork server exited ({self._process.poll()})")
        answer = json.loads(line)
        return subprocess.CompletedProcess(["rayft", *argv], answer["returncode"], answer["stdout"], answer["stderr"])

    def close(self) -> None:
        """Stop the server (its stdin closed: it exits between commands)."""
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        finally:
            self._answers.close()
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()

    def __enter__(self) -> CliForks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child(request: dict[str, Any], out: Path, err: Path) -> None:
    """In the fork: become ``python -m rayft ARGV`` in the request's directory, then exit with its code
    (never return into the server's loop)."""
    code = 1
    atexit._clear()  # the server's exit functions (its temporary directory's removal) are not the command's
    try:
        _redirect(out, err)
        os.chdir(request["cwd"])
        os.environ.update(request["env"])
        code = _run_cli(request["argv"])
    except BaseException:  # an uncaught error: its traceback and status 1, as Python's own exit
        import traceback

        traceback.print_exc()
    finally:
        logging.shutdown()  # what the interpreter runs at exit, which os._exit skips: log handlers flushed
        atexit._run_exitfuncs()  # and the functions the command registered
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def _redirect(out: Path, err: Path) -> None:
    """Standard input from /dev/null (not the server's requests), output and errors into files."""
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):  # fmt: skip
        target = os.open(path, flags, 0o600)
        os.dup2(target, fd)
        os.close(target)


def _run_cli(argv: list[str]) -> int:
    """``rayft ARGV``'s exit status, as the interpreter makes it of a SystemExit."""
    from rayft.cli.main import cli

    try:
        cli.main(args=argv, prog_name="rayft")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    return 0


def _serve(answers_fd: int) -> None:
    """Import what commands share, then run each request line in a fork until stdin closes."""
    for name in PRELOAD:
        importlib.import_module(name)
    answers = os.fdopen(answers_fd, "w", encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="rayft-cli-forks-") as scratch:
        out, err = Path(scratch) / "stdout", Path(scratch) / "stderr"
        for line in sys.stdin:
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                answers.close()
                _child(request, out, err)
            _, status = os.waitpid(pid, 0)
            answer = {"returncode": os.waitstatus_to_exitcode(status), "stdout": out.read_text(errors="replace"),
                      "stderr": err.read_text(errors="replace")}  # fmt: skip
            answers.write(json.dumps(answer) + "\n")
            answers.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
