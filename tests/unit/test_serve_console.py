"""Ray Serve's own lines stay off the console (its log files keep them), unless the user asks for them."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from rayft.console import VERBOSE_ENV
from rayft.serving.access_log import SERVE_LOGGER, controller_log_level, quiet_serve_console


class FileLike(logging.StreamHandler):  # type: ignore[type-arg]
    """Stands for Serve's (memory-buffered) file handler: any handler that is not a plain stream handler."""


@pytest.fixture
def serve_logger() -> Iterator[tuple[logging.Logger, io.StringIO, io.StringIO]]:
    """Serve's logger with a console handler and a file-like handler, as Serve configures it in a process."""
    logger = logging.getLogger(SERVE_LOGGER)
    saved = (logger.handlers[:], logger.level, logger.propagate)
    console, file = io.StringIO(), io.StringIO()
    logger.handlers = [logging.StreamHandler(console), FileLike(file)]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, console, file
    logger.handlers, logger.level, logger.propagate = saved


def log_three(logger: logging.Logger) -> None:
    logger.info("Deploying new version of Deployment(name='model-0')")
    logger.info("POST /v1/completions 200 53.0ms", extra={"serve_access_log": True})
    logger.warning("Replica is unhealthy")


def test_console_shows_only_warnings_while_the_files_keep_everything(
    serve_logger: tuple[logging.Logger, io.StringIO, io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    logger, console, file = serve_logger
    quiet_serve_console()
    log_three(logger)
    assert console.getvalue().splitlines() == ["Replica is unhealthy"]
    assert "Deploying new version" in file.getvalue() and "POST /v1/completions" in file.getvalue()
    assert controller_log_level() == "WARNING"


def test_access_lines_on_the_console_when_asked(
    serve_logger: tuple[logging.Logger, io.StringIO, io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    logger, console, _ = serve_logger
    quiet_serve_console()
    quiet_serve_console(keep_access=True)  # called again: the newer gate replaces the older one
    log_three(logger)
    assert console.getvalue().splitlines() == ["POST /v1/completions 200 53.0ms", "Replica is unhealthy"]


def test_verbose_shows_everything(
    serve_logger: tuple[logging.Logger, io.StringIO, io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VERBOSE_ENV, "1")
    logger, console, _ = serve_logger
    quiet_serve_console()
    log_three(logger)
    assert len(console.getvalue().splitlines()) == 3
    assert controller_log_level() == "INFO"
