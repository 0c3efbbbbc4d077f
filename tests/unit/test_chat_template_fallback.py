"""A tokenizer that ships no chat template gets ChatML, with a warning that names the fix."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rayft.config.model import ModelConfig
from rayft.models.loading import choose_chat_template, load_tokenizer
from rayft.models.registry import CHATML_TEMPLATE
from rayft.testing.tiny import build_tiny_tokenizer


def test_a_gguf_without_a_chat_template_gets_chatml_and_a_warning_naming_the_fix() -> None:
    template, warning = choose_chat_template(None, None, "GGUF file 'model.Q4_0.gguf'")
    assert template == CHATML_TEMPLATE
    assert warning is not None
    assert "GGUF file 'model.Q4_0.gguf' ships no chat template" in warning
    assert "set model.chat_template" in warning


def test_no_warning_when_a_template_is_shipped_or_configured() -> None:
    assert choose_chat_template(None, "{{ shipped }}", "x") == ("{{ shipped }}", None)
    assert choose_chat_template("{{ mine }}", None, "x") == ("{{ mine }}", None)


def test_loading_a_tokenizer_without_a_template_logs_the_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = build_tiny_tokenizer(tmp_path / "tok")
    (directory / "chat_template.jinja").unlink(missing_ok=True)
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("chat_template", None)
    config_file.write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="rayft"):
        tokenizer = load_tokenizer(ModelConfig(name=str(directory)))
    assert tokenizer.chat_template == CHATML_TEMPLATE
    assert any("ships no chat template" in r.getMessage() for r in caplog.records)
