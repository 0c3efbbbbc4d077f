"""API keys of ``rayft serve``: where they come from, how a request's key is checked, and exposure.

Keys come from an environment variable (comma- or newline-separated) or a file (one a line, ``#``
comments), never from the command line or the config file, where they would be seen in ``ps``
or committed with the config. They are read once, by the process that builds the application,
and only their SHA-256 digests travel on (through Ray to the router), so no key is stored in Ray
or written to a log. A request's bearer token is hashed and compared with every digest in
constant time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path

from rayft.errors import ConfigError
from rayft.files import unreadable_file

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def digest(key: str) -> bytes:
    """The SHA-256 digest a key is kept and compared as."""
    return hashlib.sha256(key.encode("utf-8")).digest()


def _split(text: str) -> list[str]:
    lines = (line.split("#", 1)[0] for line in text.replace(",", "\n").splitlines())
    return [key for key in (line.strip() for line in lines) if key]


def load_key_digests(
    env_var: str | None, file: str | None, environ: Mapping[str, str] | None = None
) -> tuple[bytes, ...]:
    """The digests of the keys in ``env_var`` and ``file`` (none set: no keys, every request is served).

    Raises:
        ConfigError: the file cannot be read (missing, a directory...) or holds no key (a server meant
            to be closed must not open).
    """
    environ = os.environ if environ is None else environ
    keys = _split(environ.get(env_var, "")) if env_var else []
    if file:
        path = Path(file).expanduser()
        problem = unreadable_file(path)
        if problem == "is a directory, not a file":
            raise ConfigError(f"serve.api_keys_file={file!r} {problem}; give the file of keys (one a line) in it")
        if problem is not None:
            raise ConfigError(f"serve.api_keys_file={file!r} {problem}; create it with one API key a line, or unset it")
        from_file = _split(path.read_text(encoding="utf-8"))
        if not from_file:
            raise ConfigError(f"serve.api_keys_file={file!r} holds no key; write one API key a line, or unset it")
        keys += from_file
    return tuple(dict.fromkeys(digest(key) for key in keys))


def authorized(header: str | None, digests: tuple[bytes, ...]) -> bool:
    """Whether an ``Authorization`` header carries one of the keys (always, when there are none)."""
    if not digests:
        return True
    scheme, _, token = (header or "").partition(" ")
    presented = digest(token.strip())
    matched = False
    for known in digests:  # every digest compared: the time taken does not tell which one matched
        matched |= hmac.compare_digest(presented, known)
    return matched and scheme.lower() == "bearer"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, has_keys: bool, env_var: str | None) -> str | None:
    """A warning for a server open beyond this machine with no key, else None."""
    if has_keys or is_loopback(host):
        return None
    where = f"set {env_var} (comma-separated keys)" if env_var else "set serve.api_keys_env"
    return (
        f"serving on {host} without API keys: anyone who can reach this port can use the models; {where} or "
        "serve.api_keys_file, or bind 127.0.0.1"
    )
