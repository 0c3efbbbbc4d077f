"""Keeping credentials out of everything rayft shows or writes: the console, logs, output rows,
reports, resolved configs, model cards, tracker parameters, checkpoints.

Credentials reach rayft through the environment (``HF_TOKEN``, ``WANDB_API_KEY``, the variable an
endpoint's ``api_key_env`` names...), or embedded in a URI (``s3://bucket/runs?secret_key=...``,
``http://host/v1?api_key=...``, ``https://user:password@host``). Workers inherit them from the
process environment where they need them (a local cluster's raylet inherits the driver's); rayft
never copies them into a Ray runtime environment, a config file or a log line.

:func:`redact` masks them in text. :func:`install_redaction`, which the CLI runs before any
command, the Python API before each call and every Ray worker rayft starts when it starts, applies
it to every log record and to everything written to stdout and stderr; the writers of files (the
resolved config, :func:`rayft.files.write_text_atomic`, the JSON Lines writers) apply it to what
they write.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, TextIO

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
# Any other variable whose name says it holds a credential is treated the same way ("KEY" takes in
# the names users give an endpoint's key: LLM_KEY, OPENROUTER_KEY...).
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSW|KEY|CREDENTIAL)", re.IGNORECASE)
# Short values ("1", "true") would redact ordinary text; real credentials are longer.
_MIN_SECRET_LENGTH = 8
MASK = "***REDACTED***"
# Credentials embedded in a URI: every query or fragment parameter whose name holds one of these
# words (api_key=, X-Amz-Signature=, access_token=, sig=, auth=...), the password of
# ``scheme://user:password@host``, and a long user of ``scheme://TOKEN@host``.
SECRET_PARAM_WORDS = ("key", "token", "secret", "passw", "sig", "credential", "auth", "session")
# A URI is matched in every form it takes once something normalised it: percent-encoded
# (``Path.as_uri``, ``urllib.parse.quote``), with its ``//`` made one slash (``pathlib``,
# ``os.path.normpath``) or backslashes (a Windows path), inside a longer path (made absolute). So each
# delimiter is matched as itself or encoded, and the scheme's slashes as one or more of either kind.
_COLON = r"(?::|%3[aA])"
_SLASH = r"(?:/|\\|%2[fF]|%5[cC])"
_AT = r"(?:@|%40)"
_AMP = r"(?:&|%26)"
_HASH = r"(?:#|%23)"
_EQUALS = r"(?:=|%3[dD])"
_PARAM_START = r"(?:[?&#;]|%3[fF]|%26|%23)"
# Every pattern below runs in time linear in the text (it masks every line rayft prints): names are
# scanned atomically and stop at the next parameter's start, a scheme is tried where a word starts.
_PARAM_NAME = re.compile(rf"{_PARAM_START}((?>(?:(?!%3[fF]|%26|%23|%3[dD])[^=&#?;\s])*))(?:=|%3[dD])", re.IGNORECASE)
_SECRET_NAME_WORD = re.compile("|".join(SECRET_PARAM_WORDS), re.IGNORECASE)
# A value ends at a quote, backslash, bracket or parenthesis too (no credential holds one): a URI
# inside JSON, repr(), HTML or prose stays well-formed. Only a literal & or # ends it: an encoded one
# is part of the value in a URL as written, and in a URL encoded whole the rest of it is masked too
# (more than the credential, never less).
_PARAM_VALUE = re.compile(r"[^&#\s'\"\\<>()]+")
# A scheme starts where a word starts, or right after an encoded character (``%2Fhttps%3A``).
_SCHEME = rf"(?:(?<![A-Za-z0-9+.\-])|(?<=%[0-9A-Fa-f]{{2}}))[A-Za-z](?>[A-Za-z0-9+.\-]*){_COLON}(?>{_SLASH}+)"
_USER = rf"(?>(?:(?!{_COLON}|{_AT}|{_SLASH})[^\s/\\:@'\"<>()])*)"
# The password runs to the last @ before a literal slash, as a URL parser splits the userinfo; an
# encoded delimiter may be part of it.
_USERINFO = re.compile(rf"({_SCHEME}{_USER}{_COLON})([^\s/\\'\"<>()]+)({_AT})")
# A user alone is a credential when it is as long as one (a token, as GitHub and others take it);
# short users (git@, ubuntu@) are names.
_TOKEN_USER = re.compile(rf"({_SCHEME})([^\s/\\:@'\"<>()]{{8,}})({_AT})")

# Values this process was handed as credentials (see remember_secret), whatever their variable's name.
_REMEMBERED: set[str] = set()


def is_secret_name(name: str) -> bool:
    """Whether an environment variable of this name holds a credential."""
    return name in SECRET_ENV_VARS or _SECRET_NAME.search(name) is not None


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the credential variables set in ``environ``, longest first; by default, those of
    this process's environment and those handed over with :func:`remember_secret`."""
    env = os.environ if environ is None else environ
    names = {n for n in env if is_secret_name(n)}
    values = {env[n] for n in names if len(env[n]) >= _MIN_SECRET_LENGTH}
    if environ is None:
        values |= _REMEMBERED
    return sorted(values, key=len, reverse=True)


def remember_secret(value: str | None) -> None:
    """Treat ``value`` as a credential in this process from now on, whatever the variable that held
    it is called (say, the key of an endpoint's ``api_key_env``)."""
    if value and len(value) >= _MIN_SECRET_LENGTH:
        _REMEMBERED.add(value)


def mask_secret_fields(value: Any) -> Any:
    """``value`` with the value of every mapping key that names a credential (``HF_TOKEN``, ``api_key``)
    masked, at any depth: for showing a bad config value, such as ``k8s.env``, in an error."""
    if isinstance(value, Mapping):
        return {k: MASK if is_secret_name(str(k)) else mask_secret_fields(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask_secret_fields(v) for v in value]
    return value


def mask_uri(text: str) -> str:
    """``text`` with every credential embedded in a URI masked, in any form a normalisation left the
    URI in (percent-encoded, one slash after the scheme, backslashes): query and fragment parameters
    such as ``secret_key=`` or ``#access_token=``, the password of ``user:password@host``, and a token
    given as the user (``TOKEN@host``)."""
    text = _mask_secret_params(text)
    text = _USERINFO.sub(lambda m: m.group(1) + MASK + m.group(3), text)
    return _TOKEN_USER.sub(lambda m: m.group(1) + MASK + m.group(3), text)


def _mask_secret_params(text: str) -> str:
    """``text`` with the value of every query or fragment parameter named for a credential masked."""
    spans: list[tuple[int, int]] = []
    for head in _PARAM_NAME.finditer(text):
        if not _SECRET_NAME_WORD.search(head.group(1)):
            continue
        value = _PARAM_VALUE.match(text, head.end())
        if value is not None and (not spans or head.end() >= spans[-1][1]):
            spans.append(value.span())
    for start, end in reversed(spans):
        text = text[:start] + MASK + text[end:]
    return text


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every credential value of the environment, and every credential embedded in
    a URI, replaced by a mask."""
    for value in secret_values(environ):
        text = text.replace(value, MASK)
    return mask_uri(text)


class RedactingStream:
    """A text stream (stdout or stderr) that masks credentials in everything written to it.

    Each write is masked whole: a credential split across two writes would pass, which is why the
    text of a log record is masked before it is written (see :func:`install_redaction`).
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        """Write ``text`` with its credentials masked; returns the length of ``text``, as callers expect."""
        self.stream.write(redact(text))
        return len(text)

    def writelines(self, lines: list[str]) -> None:
        """Write each line, masked."""
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        # flush, fileno, isatty, encoding, buffer...: those of the stream underneath
        return getattr(self.stream, name)


_INSTALL_LOCK = threading.Lock()


def install_redaction() -> None:
    """Mask credentials in everything this process logs or prints from now on: every log record
    (its message and traceback, before any handler sees it: the console, the run's log file, Ray's
    log files) and every write to ``sys.stdout`` and ``sys.stderr``. Safe to call more than once.

    The CLI calls it before any command runs, the Python API before each call, and Ray workers
    when they start (the Ray that rayft starts or joins runs it as its worker set-up hook).
    """
    with _INSTALL_LOCK:
        factory = logging.getLogRecordFactory()
        if not getattr(factory, "_rayft_redacting", False):
            logging.setLogRecordFactory(_redacting_factory(factory))
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is not None and not isinstance(stream, RedactingStream):
                setattr(sys, name, RedactingStream(stream))


def _redacting_factory(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def make_redacted(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        redact_record(record)
        return record

    make_redacted._rayft_redacting = True  # type: ignore[attr-defined]
    return make_redacted


def redact_record(record: logging.LogRecord) -> None:
    """Mask credentials in a log record's message and in its traceback, in place."""
    try:
        message = record.getMessage()
    except (TypeError, ValueError):  # arguments that do not fit the format: logging reports it later
        return
    masked = redact(message)
    if masked != message:
        record.msg, record.args = masked, None
    if record.exc_info and not record.exc_text:
        # formatters reuse exc_text when it is set: the traceback is written masked
        record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
