"""`rayft eval` with the 'openai' backend against a real `rayft serve` of the tiny model (with an API key): the
same generations and scores as the in-process backend on the same prompts, and one-line errors when the server
cannot be reached, refuses the key or does not serve the model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import rayft
from rayft import api
from rayft.config import RayftConfig, load_config
from rayft.errors import EndpointError
from rayft.evaluation.runner import eval_source

pytestmark = pytest.mark.integration

KEY = "sk-rayft-" + "Hf3kQ9wLz2Xc7Vb1Nm5Tr8Ye"
KEY_ENV = "RAYFT_TEST_EVAL_KEY"


@pytest.fixture(scope="module")
def adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter of the tiny model with large seeded weights: its completions vary from prompt to prompt."""
    from tests.support.checkpoints import build_lora_checkpoint

    return build_lora_checkpoint(tmp_path_factory.mktemp("adapters") / "alpha", tiny_model_dir, seed=1, scale=0.5)


@pytest.fixture(scope="module")
def server(ray_session: None, adapter: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rayft.ServeHandle]:
    keys = tmp_path_factory.mktemp("keys") / "api-keys"
    keys.write_text(f"{KEY}\n", encoding="utf-8")
    cfg = RayftConfig.model_validate({"serve": {"max_batch_size": 8, "api_keys_file": str(keys)}})
    with api.serve(cfg, [str(adapter)], port=0) as handle:
        yield handle


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Questions of different lengths, with references sharing words the adapter's completions hold (so that
    ROUGE-L differs from row to row and from zero)."""
    path = tmp_path_factory.mktemp("data") / "eval.jsonl"
    rows = [
        {"question": f"Tom has {n} apples and buys {n * 3} more.{' How many?' * (n % 3)}",
         "answer": f"put the {n} an tion in answer put"}
        for n in range(1, 9)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's key, in the variable eval.endpoint.api_key_env names."""
    monkeypatch.setenv(KEY_ENV, KEY)


def _cfg(*overrides: str) -> RayftConfig:
    base = [
        "eval.task=rouge",  # a continuous score, which any row of another text would move
        "eval.max_samples=8",
        "eval.generation.max_new_tokens=12",
        "eval.batch_size=4",
        "eval.bootstrap_samples=200",
        "eval.runtime=local",
    ]
    return load_config(None, [*base, *overrides])


def _served(server: rayft.ServeHandle, *overrides: str) -> list[str]:
    return ["eval.backend=openai", f"eval.endpoint.base_url={server.base_url}", f"eval.endpoint.api_key_env={KEY_ENV}",
            *overrides]  # fmt: skip


def _outputs(path: Path) -> list[str]:
    return [json.loads(line)["output"] for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "raw-text"])
def test_a_served_model_scores_as_the_in_process_one(
    server: rayft.ServeHandle, adapter: Path, dataset: Path, tmp_path: Path, chat: bool
) -> None:
    options = [f"eval.use_chat_template={str(chat).lower()}", f"eval.datasets=[{{path: {dataset}}}]"]
    served = api.evaluate(_cfg(*options, *_served(server)), "alpha", output_dir=tmp_path / "srv")
    local = api.evaluate(_cfg(*options), str(adapter), output_dir=tmp_path / "local")
    texts = _outputs(served.predictions_path)
    assert len(texts) == 8 and any(texts)
    assert texts == _outputs(local.predictions_path)  # greedy: where the model runs changes nothing
    assert served.model.generation_errors == 0
    assert served.metrics == local.metrics
    assert served.metrics["rougeL_f1"].value > 0  # a score that rows of other text would move
    report = json.loads(served.json_path.read_text(encoding="utf-8"))
    assert report["fingerprint"] == {"kind": "served", "model": "alpha", "endpoint": server.base_url, "sha256": None}
    written = "".join(p.read_text(encoding="utf-8") for p in (tmp_path / "srv").iterdir())
    assert KEY not in written and KEY_ENV in written  # the variable's name is kept, never its value


def test_unreachable_server_wrong_model_and_refused_key_are_one_line_errors(
    server: rayft.ServeHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft.serving.app import free_port

    model = server.model_ids[0]
    with pytest.raises(EndpointError, match=rf"serves no model 'gamma' \(it serves: {model}, alpha\); pass one"):
        eval_source("gamma", _cfg(*_served(server)))
    nobody = f"http://127.0.0.1:{free_port('127.0.0.1')}/v1"
    with pytest.raises(EndpointError, match=f"cannot reach the OpenAI-compatible server at {nobody} .*eval.endpoint"):
        eval_source(model, _cfg(*_served(server), f"eval.endpoint.base_url={nobody}"))
    monkeypatch.setenv(KEY_ENV, "sk-wrong")
    with pytest.raises(EndpointError, match=f"refused the API key sent \\(HTTP 401\\); set the .* {KEY_ENV}") as caught:
        eval_source(model, _cfg(*_served(server)))
    assert "sk-wrong" not in str(caught.value)
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(EndpointError, match=f"needs an API key \\(HTTP 401\\) and none was sent; set .*{KEY_ENV}"):
        eval_source(model, _cfg(*_served(server)))


def test_the_cli_says_so_in_one_line(server: rayft.ServeHandle, tiny_model_dir: Path, tmp_path: Path) -> None:
    from rayft.cli.main import cli

    config = tmp_path / "cfg.yaml"
    config.write_text(f"model:\n  name: {tiny_model_dir}\n", encoding="utf-8")
    args = ["eval", str(config), *_served(server), "--model", "gamma", "--output", str(tmp_path / "out")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith("Error: the server at ") and "serves no model 'gamma'" in errors[0]
    assert "Traceback" not in result.output
