"""Ray Serve's own lines off the console: they belong in the Serve log files.

Serve logs every request (``POST /v1/completions 200 53ms``, ``CALL generate OK``) and its own
progress (``Deploying new version``, ``Adding 1 replica``, ``Proxy starting``) to its log files and to
each process's stderr, which Ray forwards to the driver's console (and a notebook's cells); under load
those lines bury what a user must read. :func:`quiet_serve_console`, called in the driver and in each
replica of ``rayft serve``, keeps them in the files only: the console shows Serve's warnings and
errors, its access lines with ``serve.access_log_console: true``, and everything with ``--verbose``.
Serve's controller and proxies, where rayft runs no code, log at :func:`controller_log_level`. The
lines hold a method, a route, a status and a latency: never a key or a prompt.
"""

from __future__ import annotations

import logging

from rayft.console import is_verbose

SERVE_LOGGER = "ray.serve"

# The level of the records Serve's log files keep in rayft's deployments (the access log among them).
FILE_LOG_LEVEL = "INFO"


class _ConsoleGate(logging.Filter):
    """Passes Serve's warnings and errors, its access records when asked, and its other records when verbose."""

    def __init__(self, keep_access: bool, keep_info: bool) -> None:
        super().__init__()
        self.keep_access, self.keep_info = keep_access, keep_info

    def filter(self, record: logging.LogRecord) -> bool:
        """True for a record the console shows."""
        if record.levelno >= logging.WARNING:
            return True
        return self.keep_access if getattr(record, "serve_access_log", False) else self.keep_info


def quiet_serve_console(keep_access: bool = False) -> None:
    """Gate the console (stream) handlers of Serve's logger in this process; its file handlers keep every record."""
    gate = _ConsoleGate(keep_access=keep_access or is_verbose(), keep_info=is_verbose())
    for handler in logging.getLogger(SERVE_LOGGER).handlers:
        if type(handler) is logging.StreamHandler:
            for old in [f for f in handler.filters if isinstance(f, _ConsoleGate)]:
                handler.removeFilter(old)
            handler.addFilter(gate)


def controller_log_level() -> str:
    """The level of Serve's controller and proxies: warnings, or everything with ``--verbose``. Their lines
    reach the console through Ray's log forwarding, which no filter of rayft's sees."""
    return "INFO" if is_verbose() else "WARNING"
