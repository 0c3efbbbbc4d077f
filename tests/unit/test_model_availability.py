"""Whether a model can be had on this machine, decided before anything loads: offline and not cached
is refused at once with the names this machine has; broken local directories are named."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError, ModelError
from rayft.models.hub import (
    check_model_available,
    check_tokenizer_files,
    check_trainable_model,
    did_you_mean,
    read_model_config,
)
from rayft.models.resolve import resolve_model_source


def test_offline_a_missing_hub_model_is_refused_at_once_with_a_did_you_mean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models--org--cached-model").mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_model_available("org/cached-model")  # in the cache: usable offline
    started = time.monotonic()
    with pytest.raises(ModelError) as raised:
        check_model_available("smollm2-135m-instrukt")
    assert time.monotonic() - started < 1
    message = str(raised.value)
    assert "the Hub is switched off (HF_HUB_OFFLINE=1)" in message
    assert "Did you mean 'smollm2-135m-instruct'?" in message
    assert "Models this machine has: smollm2-135m-instruct, org/cached-model." in message
    assert "model.architecture" not in message  # it cannot fix a missing model


def test_an_adapter_or_a_run_is_refused_as_a_model_to_train_from_with_the_export_that_fixes_it(tmp_path: Path) -> None:
    adapter = tmp_path / "run" / "final"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (tmp_path / "run" / "checkpoints").mkdir()
    for source, holds in ((adapter, "a LoRA adapter"), (tmp_path / "run", "a training run")):
        with pytest.raises(ModelError) as raised:
            check_trainable_model(str(source))
        message = str(raised.value)
        assert holds in message and f"rayft export {source} MERGED_DIR --merge" in message
        assert "\n" not in message
    model = tmp_path / "merged"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    check_trainable_model(str(model))


def test_a_close_name_is_suggested_case_aside() -> None:
    assert did_you_mean("org/Cached-Modle", ["org/cached-model"]) == " Did you mean 'org/cached-model'?"
    assert did_you_mean("something-else", ["org/cached-model"]) == ""


def test_broken_local_model_directories_are_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("")
    with pytest.raises(ModelError, match=r"config.json is not valid JSON .*restore it"):
        read_model_config(tmp_path)
    with pytest.raises(ModelError, match=r"has no tokenizer \(none of tokenizer.json"):
        check_tokenizer_files(tmp_path)


def test_a_missing_path_under_a_local_directory_is_a_path_not_a_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_model_source("runs/nope").kind == "hub"
    (tmp_path / "runs").mkdir()
    assert resolve_model_source("runs/nope").kind == "local"


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("file:/tmp/mlruns", r"MLflow 3 refuses its file: store unless MLFLOW_ALLOW_FILE_STORE=true"),
        ("/tmp/mlruns", r"not an MLflow tracking URI \(scheme 'missing'\)"),
        ("htp://host:5000", r"not an MLflow tracking URI \(scheme 'htp'\)"),
    ],
)
def test_mlflow_tracking_uris_mlflow_would_refuse_are_refused_at_validation(
    uri: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"logging.mlflow.tracking_uri={uri}"])
    for good in ("http://h:5000", "sqlite:////tmp/m.db", "postgresql+psycopg2://u@h/db"):
        load_config(None, [f"logging.mlflow.tracking_uri={good}"])
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    load_config(None, ["logging.mlflow.tracking_uri=file:/tmp/mlruns"])
