"""What a user sees, and secrets never leak. One driver process runs every command on one Ray.

`rayft run` (symbolic sdg, train on 2 workers, eval) shows rayft's stage headers, training steps and
generation progress on the console, and keeps Ray's progress logging and known noise in the run's
log file.

With canary values in the credential variables (``HF_TOKEN``,
``MLFLOW_TRACKING_TOKEN``, an endpoint's ``api_key_env`` variable), in a URL's query and in a URL's
password, and a local OpenAI-compatible server that echoes the key and the URL it is sent, every
command (run, sdg with the OpenAI teacher, train on one Ray Train worker, export, eval, compare, generate
and chat) writes them nowhere: not in the run directory (config, metrics, checkpoints, final/,
logs), not in the outputs and reports, not in the Ray session directory (logs of every process, a
rank 1's among them from `run`'s training on 2 workers), not in the job's runtime environment as Ray
stores it, not on the console."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.canaries import CANARIES, files_containing
from tests.support.openai_server import OpenAIServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
QUERY_CANARY = "canary-query-key-0123456789"
PASSWORD_CANARY = "canary-url-password-0123"
NEEDLES = {**CANARIES, "url query": QUERY_CANARY, "url password": PASSWORD_CANARY}
RAY_NOISE = (
    "Running Dataset",  # Ray Data's progress logging
    "Starting execution of Dataset",
    "Total Progress",
    "falling back to serialize",  # a column Ray Data could not store as Arrow
    "FutureWarning",
    "Reporting training result",  # Ray Train, per step and rank
    "Loading weights",  # Hugging Face progress bars
    "publisher trust check",  # the kernels package, imported with bitsandbytes by PEFT in an eval actor
    "Started a local Ray instance",
)


def write_console_config(inputs: Path, tmp_path: Path, model_dir: Path) -> Path:
    """The config of `rayft run`: symbolic sdg, 2 training steps on 2 workers, a 4-prompt eval."""
    config = inputs / "console.yaml"
    config.write_text(
        f"""
name: console
storage_path: {tmp_path / "runs"}
model: {{name: {model_dir}}}
sdg:
  seeds: {{path: "builtin:arithmetic", max_rows: 8}}
  num_seeds: 8
  variations: 1
data:
  validation_fraction: 0.0
  max_seq_length: 128
lora: {{r: 4}}
train: {{max_steps: 2, micro_batch_size: 2, save_steps: 2, logging_steps: 1}}
scaling: {{num_workers: 2}}
logging: {{tensorboard: false}}
eval:
  datasets: [{{path: "builtin:arithmetic", split: test, max_rows: 4}}]
  batch_size: 2
  num_workers: 1
  generation: {{max_new_tokens: 4}}
"""
    )
    return config


def write_config(inputs: Path, tmp_path: Path, model_dir: Path, base_url: str) -> Path:
    """One config for every command: the endpoint's URL carries a key in its query and a password."""
    host = base_url.removeprefix("http://")
    config = inputs / "secrets.yaml"
    config.write_text(
        f"""
name: secrets
storage_path: {tmp_path / "runs"}
model: {{name: {model_dir}}}
data:
  datasets: [{{path: "builtin:arithmetic", max_rows: 64}}]
  validation_fraction: 0.1
  max_seq_length: 128
lora: {{r: 4}}
train: {{max_steps: 4, save_steps: 2, eval_steps: 2}}
scaling: {{num_workers: 1}}
eval:
  datasets: [{{path: "builtin:arithmetic", split: test, max_rows: 2}}]
  num_workers: 1
  generation: {{max_new_tokens: 4}}
inference:
  endpoint: {{base_url: "http://user:{PASSWORD_CANARY}@{host}?api_key={QUERY_CANARY}", api_key_env: LLM_ACCESS,
             max_retries: 0}}
sdg:
  generator: llm
  num_seeds: 2
  variations: 1
  teacher:
    backend: openai
    model: {{name: teacher-1}}
    endpoint: {{base_url: "{base_url}?api_key={QUERY_CANARY}", api_key_env: LLM_ACCESS, max_retries: 0}}
"""
    )
    return config


def cli_commands(tmp_path: Path, config: Path, model_dir: Path, base_url: str) -> list[list[str]]:
    """Each command a user runs, on the tiny model; the endpoint answers every request with HTTP 401."""
    run_dir, out = str(tmp_path / "runs" / "secrets"), tmp_path / "out"
    prompts = config.parent / "prompts.jsonl"
    prompts.write_text('{"prompt": "What is 2 + 3?"}\n{"messages": [{"role": "user", "content": "Hi"}]}\n')
    common = ["--config", str(config)]
    return [
        ["run", str(write_console_config(config.parent, tmp_path, model_dir))],
        ["sdg", str(config), "--output-dir", str(out / "sdg")],
        ["train", str(config)],
        ["export", run_dir, str(out / "exported"), *common],
        ["eval", str(config), "--model", run_dir, "--output", str(out / "eval")],
        ["compare", str(config), "--model", f"base={model_dir}", "--model", f"tuned={run_dir}",
         "--output", str(out / "compare")],
        ["generate", "gpt-x", "--backend", "openai", "--input", str(prompts), "--output", str(out / "gen.jsonl"),
         *common, f"inference.endpoint.base_url={base_url}?api_key={QUERY_CANARY}"],
        ["chat", run_dir, *common, "--max-new-tokens", "4", "--device", "cpu"],
    ]  # fmt: skip


@dataclass
class Commands:
    """What one driver process running every command left: its console (stdout and stderr in the
    order written), the HTTP statuses the endpoint answered, and where it wrote."""

    result: subprocess.CompletedProcess[str]
    statuses: list[int]
    base_url: str
    tmp_path: Path
    inputs: Path
    ray_tmp: Path
    stored: Path

    def output_of(self, name: str) -> str:
        """What the console showed of the command ``name`` (between the driver's begin and exit lines)."""
        found = re.search(rf"^begin: {name}\n(.*?)^exit \d+: {name}$", self.result.stdout, re.S | re.M)
        assert found, f"no output framed for {name}:\n{self.result.stdout[-4000:]}"
        return found.group(1)


@pytest.fixture(scope="module")
def commands_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Commands]:
    """Every command, run once by one driver process on one fresh Ray private to it."""
    tmp_path = tmp_path_factory.mktemp("secrets")
    inputs = tmp_path / "inputs"  # the user's config and prompts, which hold the URL: not grepped
    inputs.mkdir()
    ray_tmp = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))  # short: Ray's socket paths have a length limit
    stored = tmp_path / "ray-stored.json"
    env = {**os.environ, **CANARIES, "RAY_TMPDIR": str(ray_tmp), "RAYFT_CACHE": str(tmp_path / "cache"),
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    env.pop("RAYFT_VERBOSE", None)
    try:
        with OpenAIServer(responder=lambda request: "unused", api_key="the-right-key") as server:
            config = write_config(inputs, tmp_path, tiny_model_dir, server.base_url)
            commands = cli_commands(tmp_path, config, tiny_model_dir, server.base_url)
            args = [arg for command in commands for arg in [*command, "::"]]
            result = subprocess.run(
                [sys.executable, "-m", "tests.integration.reliability_secrets_driver", str(stored), *args],
                check=False, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                timeout=900, input="What is 2 + 3?\n/exit\n",
            )  # fmt: skip
            yield Commands(result, list(server.statuses), server.base_url, tmp_path, inputs, ray_tmp, stored)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_console_shows_rayft_progress_not_ray_logs(commands_run: Commands) -> None:
    assert "exit 0: run" in commands_run.result.stdout, commands_run.result.stdout[-4000:]
    console = commands_run.output_of("run")
    for header in ("== sdg: running", "== train: running", "== eval: running"):
        assert header in console
    assert "sdg symbolic: 8/8 seeds (100%)" in console
    assert re.search(r"step 2/2 +loss \d", console), console
    for label in ("base", "tuned"):
        assert re.search(rf"eval {label}: 4/4 prompts \(100%\), [\d.]+ prompts/s, .* eta", console), console
    assert "in-distribution check, not a GSM8K result" in console
    for noise in RAY_NOISE:
        assert noise not in console, f"{noise!r} reached the console:\n{console}"
    # rayft's own progress bars print a line every few seconds: how many depends on the machine's speed
    lines = [line for line in console.splitlines() if not re.search(r": \d+/\d+ \w+ \(\d+%\)", line)]
    assert len(lines) < 40, console
    log_file = commands_run.tmp_path / "runs" / "console" / "logs" / "rayft.log"
    assert str(log_file) in console
    assert "Starting execution of Dataset" in log_file.read_text()  # Ray's logs are kept, in the file
    assert [name for name, value in CANARIES.items() if value in console] == []
    assert files_containing(commands_run.tmp_path / "runs" / "console", CANARIES) == []


def test_no_command_writes_a_secret_anywhere(commands_run: Commands) -> None:
    result, tmp_path, ray_tmp = commands_run.result, commands_run.tmp_path, commands_run.ray_tmp
    console = result.stdout  # and stderr, in the order written
    assert result.returncode == 0, console[-4000:]
    for name in ("train", "export", "eval", "compare", "chat"):
        assert f"exit 0: {name}" in console, console[-4000:]
    # sdg's teacher refuses every request: a failed start, one line, exit 2, nothing committed to skip on a rerun
    assert "exit 2: sdg" in console and "teacher requests of the first batch failed" in commands_run.output_of("sdg")
    # generate asks the server first (GET /models), which refuses the key: one line, exit 2, no prompt sent
    assert "exit 2: generate" in console and "refused the API key sent (HTTP 401)" in commands_run.output_of("generate")
    # the server was asked, and answered with the key and the URL, for sdg's prompts
    statuses = commands_run.statuses
    assert statuses.count(401) >= 2 and set(statuses) == {401}
    out, run_dir = tmp_path / "out", tmp_path / "runs" / "secrets"
    assert not (out / "gen.jsonl").exists()
    assert "api_key=***REDACTED***" in (run_dir / "config.yaml").read_text()
    assert (
        f"user:***REDACTED***@{commands_run.base_url.removeprefix('http://')}"
        in (out / "exported" / "rayft_config.yaml").read_text()
    )
    assert not list((out / "sdg" / "parts").glob("*.done.json"))
    for report in ("eval/eval.json", "compare/compare.json", "exported/README.md"):
        assert (out / report).is_file(), report
    assert list((run_dir / "checkpoints").glob("step-*")), "no checkpoint to inspect"
    assert list(ray_tmp.rglob("session_*")) and list(ray_tmp.rglob("*.log")), "no Ray logs to inspect"
    assert not list(ray_tmp.rglob("dashboard.*")), "the Ray of a rayft command starts no dashboard head (lean_head)"
    assert commands_run.stored.is_file() and "runtime_env" in commands_run.stored.read_text()

    written = [p for p in tmp_path.iterdir() if p != commands_run.inputs]  # runs, outputs, caches, Ray's record
    assert [hit for path in written for hit in files_containing(path, NEEDLES)] == []
    assert files_containing(ray_tmp, NEEDLES) == []  # every Ray log and session file
    for name, value in NEEDLES.items():
        assert value not in console, name
