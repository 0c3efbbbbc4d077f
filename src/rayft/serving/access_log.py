"""Ray Serve's access log off the console: one line per request belongs in the Serve log files.

Serve logs every request (``POST /v1/completions 200 53ms``, ``CALL generate OK``) to its log
files and to the replica's stderr, which Ray forwards to the driver's console; under load those
lines bury what a user must read. Called in each replica of ``rayft serve``, this keeps them in
the files only (``serve.access_log_console: true`` keeps them on the console too). The lines hold
a method, a route, a status and a latency: never a key or a prompt.
"""

from __future__ import annotations

import logging

SERVE_LOGGER = "ray.serve"


def _not_access(record: logging.LogRecord) -> bool:
    return not getattr(record, "serve_access_log", False)


def hide_access_log_from_console() -> None:
    """Drop Serve's access records from its stream (console) handlers; its file handlers keep them."""
    for handler in logging.getLogger(SERVE_LOGGER).handlers:
        if type(handler) is logging.StreamHandler and _not_access not in handler.filters:
            handler.addFilter(_not_access)
