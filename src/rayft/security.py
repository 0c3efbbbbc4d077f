"""Keeping credentials out of everything a run writes: logs, resolved configs, metrics, checkpoints.

Credentials reach rayft through the environment (``HF_TOKEN``, ``WANDB_API_KEY``, AWS keys...), or
embedded in a storage URI (``s3://bucket/runs?secret_key=...``), which is masked wherever it is shown.
Workers inherit them from the process environment where they need them (a local cluster's
raylet inherits the driver's); rayft never copies them into a Ray runtime environment, a config
file or a log line. :func:`redact` replaces their values in text that is about to be written, and
:class:`RedactingFilter` does the same for log records.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping

SECRET_ENV_VARS = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "WANDB_API_KEY",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS_JSON",
    "OPENAI_API_KEY",
    "RAY_AUTH_TOKEN",
)
# Any other variable whose name says it holds a credential is treated the same way.
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY)", re.IGNORECASE)
# Short values ("1", "true") would redact ordinary text; real credentials are longer.
_MIN_SECRET_LENGTH = 8
MASK = "***REDACTED***"
# Credentials embedded in a URI: query parameters (secret_key=, session_token=, sig=...) and the
# password of ``scheme://user:password@host``.
_SECRET_PARAM = re.compile(
    r"([?&][^=&#\s]*(?:secret|token|password|passwd|credential|access_key|session|signature|sig)[^=&#\s]*=)"
    r"([^&#\s'\"]+)",
    re.IGNORECASE,
)
_USERINFO = re.compile(r"(://[^/:@\s]+:)([^/@\s]+)(@)")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable of this name holds a credential."""
    return name in SECRET_ENV_VARS or _SECRET_NAME.search(name) is not None


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the credential variables set in ``environ`` (default: this process), longest first."""
    env = os.environ if environ is None else environ
    names = {n for n in env if is_secret_name(n)}
    values = {env[n] for n in names if len(env[n]) >= _MIN_SECRET_LENGTH}
    return sorted(values, key=len, reverse=True)


def mask_uri(text: str) -> str:
    """``text`` with every credential embedded in a URI masked: query parameters such as
    ``secret_key=`` and the password of ``user:password@host``."""
    text = _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, text)
    return _USERINFO.sub(lambda m: m.group(1) + MASK + m.group(3), text)


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every credential value of the environment, and every credential embedded in
    a URI, replaced by a mask."""
    for value in secret_values(environ):
        text = text.replace(value, MASK)
    return mask_uri(text)


class RedactingFilter(logging.Filter):
    """A logging filter that masks credential values in a record's message and arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; never drops it."""
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg = masked
            record.args = None
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Attach a :class:`RedactingFilter` to every handler of ``logger`` (default: the root logger)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
