"""API keys of `rayft serve`: read from an environment variable or a file, kept as digests, checked as
bearer tokens; and the warning of a server open beyond this machine without keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.errors import ConfigError
from rayft.serving.keys import authorized, digest, exposure_warning, is_loopback, load_key_digests


def test_keys_come_from_the_variable_and_the_file_as_digests(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nsk-file-1\n\nsk-file-2  # rotated in May\n", encoding="utf-8")
    digests = load_key_digests("KEYS", str(keys), {"KEYS": "sk-env-1, sk-env-2\nsk-env-1"})
    assert digests == tuple(digest(k) for k in ("sk-env-1", "sk-env-2", "sk-file-1", "sk-file-2"))
    assert all(b"sk-" not in d for d in digests)
    assert load_key_digests("KEYS", None, {}) == () and load_key_digests(None, None, {"KEYS": "x"}) == ()


def test_a_missing_or_empty_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"serve.api_keys_file='.*nowhere' does not exist"):
        load_key_digests(None, str(tmp_path / "nowhere"), {})
    (tmp_path / "empty").write_text("# none yet\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="holds no key"):
        load_key_digests(None, str(tmp_path / "empty"), {})


def test_a_key_file_that_is_a_directory_is_named_as_one(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    with pytest.raises(ConfigError, match=r"serve.api_keys_file='.*keys' is a directory, not a file; give the file"):
        load_key_digests(None, str(tmp_path / "keys"), {})


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Bearer sk-one", True),
        ("bearer sk-two", True),
        ("Bearer  sk-one ", True),
        ("Bearer sk-three", False),
        ("Basic sk-one", False),
        ("sk-one", False),
        ("", False),
        (None, False),
    ],
)
def test_a_request_needs_one_of_the_keys_as_a_bearer_token(header: str | None, expected: bool) -> None:
    digests = (digest("sk-one"), digest("sk-two"))
    assert authorized(header, digests) is expected
    assert authorized(header, ()) is True  # no keys: every request is served


def test_binding_beyond_loopback_without_keys_warns() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.5.0.1", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "example.com"))
    warning = exposure_warning("0.0.0.0", False, "RAYFT_API_KEYS")
    assert warning is not None and "without API keys" in warning and "set RAYFT_API_KEYS" in warning
    assert exposure_warning("0.0.0.0", True, "RAYFT_API_KEYS") is None
    assert exposure_warning("127.0.0.1", False, "RAYFT_API_KEYS") is None


def test_the_config_holds_where_keys_are_never_the_keys() -> None:
    from rayft.config.loader import validate_config

    with pytest.raises(ConfigError, match="api_keys"):
        validate_config({"serve": {"api_keys": ["sk-x"]}}, source="test")
    with pytest.raises(ConfigError, match="needs serve.api_keys_env"):
        validate_config({"serve": {"api_keys_env": None, "api_keys_secret": "keys"}}, source="test")
