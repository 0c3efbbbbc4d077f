"""What the console shows: rayft's own progress, and the warnings a user must act on.

By default the console gets rayft's log lines (stage headers, plans, per-step training lines,
generation progress with ETA, results) and every logger's warnings and errors; Ray's own
informational output (Ray core, Ray Data's execution and progress logging, Ray Train's
controller and reporting lines, Hugging Face progress bars) is kept off it. A command that has a
run directory also writes everything, Ray's loggers included, to its log file (``<run>/logs/rayft.log``,
:data:`rayft.runs.layout.LOG_FILE`).
``rayft --verbose`` (or ``RAYFT_VERBOSE=1``) brings Ray's output back to the console.

Internal module: the CLI and the recipes use it; it is not part of the public API.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

VERBOSE_ENV = "RAYFT_VERBOSE"

_RAY_LOGGERS = ("ray", "ray.data", "ray.train")
_FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_HANDLER_NAME = "rayft-log-file"

FILE_ONLY = {"rayft_file_only": True}
"""``extra=`` of a log record for the run's log file alone (say, Ray's traceback of a failure the
console tells in one line)."""


def is_verbose() -> bool:
    """Whether Ray's own output goes to the console too (``--verbose``, ``RAYFT_VERBOSE=1``)."""
    return os.environ.get(VERBOSE_ENV, "0").strip() not in ("", "0", "false")


class ConsoleFilter(logging.Filter):
    """Lets through rayft's own records, and other loggers' warnings and errors (all when verbose)."""

    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        """True for a record the console shows."""
        if getattr(record, "rayft_file_only", False):
            return False
        own = record.name == "rayft" or record.name.startswith("rayft.")
        return self.verbose or own or record.levelno >= logging.WARNING


class ConsoleFormatter(logging.Formatter):
    """``HH:MM:SS message`` for rayft's information, with the level and logger for anything else."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(message)s", datefmt="%H:%M:%S")
        self._detailed = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        """The record as one console line."""
        if record.levelno == logging.INFO and record.name.startswith("rayft"):
            return super().format(record)
        return self._detailed.format(record)


def setup_console(*, verbose: bool = False, debug: bool = False) -> None:
    """Configure the console for a command: rayft's lines, and Ray's only when ``verbose``.

    Sets ``RAYFT_VERBOSE`` so that the processes Ray starts from here (which inherit the
    environment) follow the same choice, and, unless verbose, turns off Hugging Face's progress bars.
    """
    verbose = verbose or debug or is_verbose()
    os.environ[VERBOSE_ENV] = "1" if verbose else "0"
    if not verbose:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    for handler in [h for h in root.handlers if getattr(h, "_rayft_console", False)]:
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ConsoleFilter(verbose))
    handler.setFormatter(ConsoleFormatter())
    handler._rayft_console = True  # type: ignore[attr-defined]
    root.addHandler(handler)


class LogFileHandler(logging.FileHandler):
    """The run's log file. Its format is fixed: Ray sets the formatter of every handler of its
    ``ray`` logger when it starts, and this handler serves that logger too."""

    def setFormatter(self, fmt: logging.Formatter | None) -> None:  # noqa: N802 (logging's name)
        """Set the format once; later calls are ignored."""
        if self.formatter is None:
            super().setFormatter(fmt)


def _attach(handler: logging.Handler, names: tuple[str, ...]) -> None:
    for name in names:
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME and h is not handler]:
            logger.removeHandler(old)
        if handler not in logger.handlers:
            logger.addHandler(handler)


def _log_file_handler() -> logging.Handler | None:
    return next((h for h in logging.getLogger().handlers if h.get_name() == _HANDLER_NAME), None)


def attach_log_file(path: Path) -> Path | None:
    """Write every log record (rayft's and Ray's loggers') to the file ``path`` as well (a run's
    is :data:`rayft.runs.layout.LOG_FILE` in its directory).

    Returns the file, or None when it cannot be created (the command then logs to the console alone).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = LogFileHandler(path, encoding="utf-8")
    except OSError:
        return None
    handler.setFormatter(logging.Formatter(_FILE_FORMAT))
    handler.set_name(_HANDLER_NAME)
    previous = _log_file_handler()
    _attach(handler, ("", *_RAY_LOGGERS))
    if previous is not None:
        previous.close()
    return path


def quiet_ray() -> None:
    """Send Ray's loggers to the run's log file, and keep Ray's informational output off the console
    (unless verbose): Ray core's console handler shows errors, Ray Data's warnings and errors, and
    Ray Data logs no progress (the errors the cluster pushes to the driver: :func:`cluster_errors_to_log_file`).
    Call it before Ray starts."""
    import ray.data  # configures the ray.data logger anew: the log file is attached again below

    handler = _log_file_handler()
    if handler is not None:
        _attach(handler, _RAY_LOGGERS)
    if is_verbose():
        return
    levels = {"ray": logging.ERROR, "ray.data": logging.WARNING}
    for name, level in levels.items():
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.setLevel(level)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # rayft shows its own progress
    context.enable_operator_progress_bars = False
    logging.getLogger("ray.data._internal.progress").addFilter(_not_progress_notice)


def cluster_errors_to_log_file(lines: list[str]) -> bool:
    """Keep the errors Ray's cluster pushes to this driver (a worker that died, with its lease, worker and node
    ids; Serve's controller task failing as Serve stops) for the log file alone: rayft tells each failure that
    matters in one line of its own. Verbose, they are left to Ray, which prints them (False)."""
    if is_verbose():
        return False
    ray_errors = logging.getLogger("rayft.ray")
    for line in lines:
        ray_errors.warning("%s", line, extra=FILE_ONLY)
    return True


def _not_progress_notice(record: logging.LogRecord) -> bool:
    """False for Ray Data's notice that its progress bars are off (rayft turned them off)."""
    return "Progress bars disabled" not in record.getMessage()


class RayInfoFilter(logging.Filter):
    """Drops the records below WARNING logged from inside the ``ray`` package (any logger name), and
    Ray Train's report of a training function's error."""

    def __init__(self, ray_dir: str) -> None:
        super().__init__()
        self.ray_dir = ray_dir

    def filter(self, record: logging.LogRecord) -> bool:
        """True for a record the console shows."""
        if not record.pathname.startswith(self.ray_dir):
            return True
        # Ray Train's copy of the error a training function raised (a worker whose peer died fails in its
        # collective): the driver tells it in one line and writes its traceback to the run's log file.
        return record.levelno >= logging.WARNING and not str(record.msg).startswith("Error in training function")


def quiet_worker_console() -> None:
    """In a Ray worker process (unless verbose): keep Ray's informational records (say, Ray Train's
    "Reporting training result" per step and rank) off the console handlers that Ray forwards to
    the driver; rayft's own lines and every warning still go through."""
    if is_verbose():
        return
    import ray

    console_filter = RayInfoFilter(os.path.dirname(ray.__file__))
    for name in ("", "ray", "ray.train"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.addFilter(console_filter)


def ignore_known_warnings() -> None:
    """Silence third-party warnings that ask nothing of a rayft user (in this process): peft reads
    transformers' deprecated ``is_gradient_checkpointing`` on every adapter it wraps; bitsandbytes
    asks for an optional kernel package on import (and `kernels`, offline, says it skipped that package's
    publisher check); DeepSpeed says it fell back to the CPU."""
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    # bitsandbytes (the qlora extra), which peft imports whenever it is installed, warns at import on CPUs with
    # AVX512-BF16 that an optional faster 4-bit kernel package is missing; its own kernels run instead.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    # That kernel comes through Hugging Face's `kernels`, which under HF_HUB_OFFLINE (rayft's offline runs)
    # warns on every such import that it skipped the kernel's publisher check; the kernel then loads from the
    # cache or bitsandbytes' own kernels run. Its other warnings still show.
    _drop_notice("kernels._internals.hf_hub", "Skipping publisher trust check")
    # DeepSpeed, imported by transformers' save_pretrained through accelerate (every export) and by ZeRO-3 runs,
    # warns on a stdout handler of its own that it fell back to the CPU on a machine without a GPU: rayft picks
    # the device itself. A filter on its logger holds whether the logger is made before or after this call.
    _drop_notice("DeepSpeed", "Setting accelerator to CPU")


class _NoticeFilter(logging.Filter):
    """Drops a logger's records whose message holds ``phrase`` (one known notice); lets the rest through."""

    def __init__(self, phrase: str) -> None:
        super().__init__()
        self.phrase = phrase

    def filter(self, record: logging.LogRecord) -> bool:
        return self.phrase not in record.getMessage()


def _drop_notice(logger_name: str, phrase: str) -> None:
    """Filter the notice holding ``phrase`` off ``logger_name``'s records, once however often this runs."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _NoticeFilter) and f.phrase == phrase for f in logger.filters):
        logger.addFilter(_NoticeFilter(phrase))


def ray_train_log_level() -> str:
    """The level of Ray Train's own console lines (its controller's and workers'): INFO when
    verbose, else ERROR. Its warnings are about what rayft reports itself in one line: when a worker
    dies, the controller warns with a traceback that shutting the others down failed "as expected"."""
    return "INFO" if is_verbose() else "ERROR"


def clock(seconds: float) -> str:
    """A duration as minutes and seconds, rounded to the nearest second: ``1m05s`` (``?`` when unknown)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def progress_line(what: str, done: int, total: int, elapsed_s: float, unit: str) -> str:
    """``what: done/total unit (pct), rate unit/s, elapsed, eta`` (a pure formatter)."""
    rate = done / elapsed_s if elapsed_s > 0 else math.nan
    eta = (total - done) / rate if done and rate > 0 else math.nan
    pct = 100.0 * done / total if total else 100.0
    rate_text = f"{rate:.2f}" if math.isfinite(rate) else "?"
    timing = f"{clock(elapsed_s)} elapsed, eta {clock(eta)}"
    return f"{what}: {done}/{total} {unit} ({pct:.0f}%), {rate_text} {unit}/s, {timing}"


class Progress:
    """Progress of a counted piece of work, with rate and ETA.

    On a terminal it is a live ``rich`` bar (the line is replaced as work completes); elsewhere
    (a log file, CI) it logs a line on ``rayft.progress`` at most every ``every_s`` seconds, and
    one at the end. Use as a context manager and call :meth:`advance`.
    """

    def __init__(self, what: str, total: int, *, unit: str = "items", every_s: float = 10.0) -> None:
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self.done = 0
        self._log = logging.getLogger("rayft.progress")
        self._started = time.monotonic()
        self._last_line = self._started
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        self._started = self._last_line = time.monotonic()
        if sys.stderr.isatty() and not is_verbose():
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(self.unit),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), transient=True,
            )  # fmt: skip
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total)
        else:
            self._log.info(progress_line(self.what, 0, self.total, 0.0, self.unit))
        return self

    def advance(self, count: int) -> None:
        """Record ``count`` more items done."""
        self.done += count
        now = time.monotonic()
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)
        elif now - self._last_line >= self.every_s and self.done < self.total:
            self._last_line = now
            self._log.info(progress_line(self.what, self.done, self.total, now - self._started, self.unit))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
        if kind is None:
            elapsed = time.monotonic() - self._started
            self._log.info(progress_line(self.what, self.done, self.total, elapsed, self.unit))
