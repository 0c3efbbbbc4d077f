"""The redactor over every form a credential takes in a path or URL once something has normalised it:
a scheme left with one slash (``pathlib``, ``os.path.normpath``), a Windows path's backslashes, a path
made absolute, percent-encoding (``Path.as_uri``, ``urllib.parse.quote``), ``repr`` and JSON; the
credential in the userinfo (``user:password@``, or a token as the user), in a query parameter, or in a
fragment (OAuth's ``#access_token=``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath, PureWindowsPath
from urllib.parse import quote

from hypothesis import given, settings
from hypothesis import strategies as st

from rayft.security import MASK, SECRET_PARAM_WORDS, mask_uri, redact

# Upper case and digits: no scheme, host, path or parameter name below holds six of them in a row, so
# finding a six-character piece of the credential in the output means it leaked.
_BODY = st.text("ABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=8, max_size=24)
# Characters a credential may hold that a URL must percent-encode (or, the last ones, may leave as they are).
_SPECIAL = st.text("@:/?#&=%+ !$*,;-._~", max_size=3)
_PIECE = 6

NORMALISATIONS: dict[str, Callable[[str], str]] = {
    "as given": lambda url: url,
    "scheme with one slash": lambda url: url.replace("://", ":/", 1),
    "os.path.normpath": os.path.normpath,
    "pathlib": lambda url: str(PurePosixPath(url)),
    "made absolute": lambda url: str(PurePosixPath("/home/u/work", os.path.normpath(url))),
    "windows path": lambda url: str(PureWindowsPath(url)),
    "Path.as_uri": lambda url: PurePosixPath("/home/u", os.path.normpath(url)).as_uri(),
    "quote": quote,
    "quote every character": lambda url: quote(url, safe=""),
    "repr of a path": lambda url: repr(PurePosixPath(url)),
    "json": json.dumps,
}


@st.composite
def credentials(draw: st.DrawFn) -> str:
    """A credential: random pieces around characters a URL has to encode."""
    return draw(_BODY) + draw(_SPECIAL) + draw(_BODY)


@st.composite
def urls_with_a_credential(draw: st.DrawFn) -> tuple[str, str]:
    """(a URL that carries ``secret`` the way URLs carry credentials, ``secret``)."""
    secret = draw(credentials())
    scheme = draw(st.sampled_from(["https", "http", "s3", "gs", "postgresql", "redis", "hf"]))
    host = draw(st.sampled_from(["host", "example.com:8443", "10.0.0.1", "bucket"]))
    path = draw(st.sampled_from(["", "/m", "/org/model", "/v1/chat"]))
    encoded = quote(secret, safe="")  # as a well-formed URL holds it
    word = draw(st.sampled_from(SECRET_PARAM_WORDS))
    param = draw(st.sampled_from([word, f"x_{word}", f"{word}_id", f"access_{word}"]))
    form = draw(st.sampled_from(["password", "token as user", "query", "second query", "fragment"]))
    url = {
        "password": f"{scheme}://bob:{encoded}@{host}{path}",
        "token as user": f"{scheme}://{encoded}@{host}{path}",
        "query": f"{scheme}://{host}{path}?{param}={encoded}",
        "second query": f"{scheme}://{host}{path}?page=2&{param}={encoded}&x=1",
        "fragment": f"{scheme}://{host}{path}#{param}={encoded}&state=s",
    }[form]
    return url, secret


def leaked(secret: str, text: str) -> list[str]:
    """The six-character pieces of the credential's random parts still in ``text``."""
    pieces = [m for part in re.findall(r"[A-Z0-9]+", secret) for m in _windows(part)]
    return [piece for piece in pieces if piece in text]


def _windows(part: str) -> list[str]:
    return [part[i : i + _PIECE] for i in range(len(part) - _PIECE + 1)]


@settings(max_examples=400, deadline=None)
@given(urls_with_a_credential(), st.sampled_from(sorted(NORMALISATIONS)), st.sampled_from(["", "Error: ", "x='"]))
def test_no_normalisation_of_a_url_lets_its_credential_through(case: tuple[str, str], how: str, before: str) -> None:
    url, secret = case
    shown = f"{before}model.name: {NORMALISATIONS[how](url)} does not exist; check the path"
    masked = redact(shown, environ={})
    assert not leaked(secret, masked), (how, shown, masked)
    assert MASK in masked


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(NORMALISATIONS)))
def test_urls_without_a_credential_are_left_alone(how: str) -> None:
    for url in ("https://host/org/model?revision=main#readme", "s3://bucket/runs/demo", "http://10.0.0.1:8000/v1"):
        text = NORMALISATIONS[how](url)
        assert mask_uri(text) == text


def test_the_train_command_shows_no_password_of_a_model_url(tmp_path: Path) -> None:
    """The case as a user meets it: the model source, normalised as a path, named in the error."""
    secret = "SECRETPW0123456789"
    config = tmp_path / "cfg.yaml"
    config.write_text("data:\n  datasets:\n    - path: data.jsonl\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "rayft", "train", str(config), f"model.name=https://bob:{secret}@host/m"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
        env={**os.environ, "RAYFT_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode != 0
    assert "Error:" in result.stderr, result.stderr
    assert secret not in result.stdout + result.stderr
    assert not any(secret in p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file())
