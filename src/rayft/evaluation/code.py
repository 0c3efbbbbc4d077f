"""Code execution scoring: a completion's Python run in :mod:`rayft.sandbox` against its row's tests.

The code is the completion's last fenced block tagged ``python`` (or ``py``), else its last untagged
fenced block, else the completion as it stands. The tests are Python statements, typically
``assert f(2) == 4``; each runs in the namespace the code left, with a time limit of its own (a timer
signal, so one endless test fails alone), and :func:`run_tests` counts those that pass. The code and
its tests run in one sandboxed process, bounded as a whole (time, memory, processes, output, no
network, no writes outside its scratch directory): a completion that hangs, forks, allocates without
end or prints without end scores 0, and the next one runs.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayft.errors import DataError
from rayft.sandbox import Limits, run_python

TIMEOUT_S = 10.0
"""Wall-clock limit of one completion's code and all its tests together."""
TEST_TIMEOUT_S = 2.0
"""Time limit of one test (the code's own top level counts as one too)."""
MEMORY_MB = 1024
"""Memory limit of the process that runs one completion."""
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_MARK = "\x1erayft-code-result "
# The result line carries a nonce the code is not given: printing a forged result does not score. Code
# that searches the interpreter's frames can still find it; the sandbox bounds what code can do, not
# what it can claim, so a reward this hackable is no proof of correctness (see docs/guides/rl.md).

_HARNESS = """
import io, json, signal, sys


def timed_out(*_):
    raise TimeoutError("the test ran past its time limit")


def run(source, namespace, seconds):
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        exec(compile(source, "<solution>", "exec"), namespace)
        return None
    except BaseException as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def main():
    job = json.load(sys.stdin)
    mark = "\\x1erayft-code-result " + job.pop("nonce") + " "
    out = sys.stdout
    sys.stdout = sys.stderr = io.StringIO()  # the code's prints are not the result
    signal.signal(signal.SIGALRM, timed_out)
    namespace = {"__name__": "solution"}
    error = run(job["code"], namespace, job["test_timeout_s"])
    tests = job["tests"]
    failures = [error] * len(tests) if error else [run(t, namespace, job["test_timeout_s"]) for t in tests]
    out.write(mark + json.dumps({"code_error": error, "failures": failures}) + "\\n")
    out.flush()


main()
"""


@dataclass(frozen=True)
class TestRun:
    """How a completion's code fared against its tests."""

    passed: int
    total: int
    error: str | None = None
    """Why no test could run (the code did not run, or its process was stopped), else None."""
    failures: tuple[str | None, ...] = ()
    """Per test: None when it passed, else its exception."""

    @property
    def fraction(self) -> float:
        """The share of tests that passed (0 for a row with no tests)."""
        return self.passed / self.total if self.total else 0.0


def extract_code(completion: str) -> str:
    """The code of a completion: its last ``python`` block, its last untagged block, or all of it."""
    blocks = _FENCE.findall(completion)
    tagged: list[str] = [body for tag, body in blocks if tag.lower() in ("python", "py", "python3")]
    untagged: list[str] = [body for tag, body in blocks if not tag]
    return (tagged or untagged or [completion])[-1]


def parse_tests(value: Any, where: str) -> list[str]:
    """A row's tests: a list of Python statements, or JSON text of one."""
    tests = json.loads(value) if isinstance(value, str) and value.lstrip().startswith("[") else value
    if isinstance(tests, str):
        tests = [tests]
    if hasattr(tests, "tolist"):  # an array column read back from Arrow or pandas
        tests = tests.tolist()
    if isinstance(tests, tuple):
        tests = list(tests)
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise DataError(
            f'{where}: the tests must be a list of Python statements (e.g. ["assert f(2) == 4"]), '
            f"not {type(tests).__name__}"
        )
    return tests


def run_tests(code: str, tests: Sequence[str], limits: Limits | None = None) -> TestRun:
    """Run ``code`` then each test in a sandboxed process; never raises for what the code does."""
    limits = limits or Limits(wall_s=TIMEOUT_S, cpu_s=TIMEOUT_S, memory_mb=MEMORY_MB, processes=16)
    nonce = secrets.token_hex(16)
    job = {"code": code, "tests": list(tests), "test_timeout_s": TEST_TIMEOUT_S, "nonce": nonce}
    result = run_python(_HARNESS, stdin=json.dumps(job), limits=limits)
    mark = f"{_MARK}{nonce} "
    lines = [line for line in result.stdout.split("\n") if line.startswith(mark)]  # not splitlines: \x1e splits there
    if not lines:
        return TestRun(0, len(tests), result.error or "the code ended the process before its tests ran")
    answer = json.loads(lines[-1].removeprefix(mark))
    failures = tuple(answer["failures"])
    return TestRun(sum(f is None for f in failures), len(tests), answer["code_error"], failures)
