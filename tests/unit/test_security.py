"""Credentials masked everywhere: in URIs (query parameters, user:password), in log records and on
stdout/stderr once :func:`install_redaction` runs (the CLI and the Python API run it), in every file
the write boundaries write, in config errors, and in what an OpenAI-compatible endpoint echoes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayft.config import dump_config, load_config
from rayft.config.generation import EndpointConfig
from rayft.errors import ConfigError
from rayft.files import write_jsonl_atomic, write_text_atomic
from rayft.generation.backend import SamplingParams
from rayft.generation.openai_http import OpenAIBackend
from rayft.security import MASK, is_secret_name, mask_uri, redact, remember_secret, secret_values
from tests.support.openai_server import OpenAIServer

CANARY = "canary-0123456789abcdef"


@pytest.mark.parametrize(
    "param",
    ["api_key", "apikey", "key", "X-Amz-Signature", "X-Amz-Credential", "access_token", "token", "sig", "sv_sig",
     "client_secret", "password", "passwd", "auth", "Authorization", "session_token", "API_KEY"],
)  # fmt: skip
def test_every_query_parameter_named_for_a_credential_is_masked(param: str) -> None:
    uri = f"http://h:8000/v1?model=m&{param}={CANARY}&page=2"
    assert mask_uri(uri) == f"http://h:8000/v1?model=m&{param}={MASK}&page=2"
    assert mask_uri(f"s3://b/p?{param}={CANARY}") == f"s3://b/p?{param}={MASK}"


def test_other_query_parameters_and_urls_are_kept() -> None:
    for text in ("http://h:8000/v1?model=m&page=2&scheme=http", "http://127.0.0.1:8000/v1", "a=b&c=d", "host:22"):
        assert mask_uri(text) == text


@pytest.mark.parametrize(
    ("uri", "masked"),
    [
        (f"https://user:{CANARY}@host/x", f"https://user:{MASK}@host/x"),
        (f"redis://:{CANARY}@host:6379/0", f"redis://:{MASK}@host:6379/0"),
        (f"postgresql://u.name:{CANARY}@db.example.com:5432/x?sslmode=require",
         f"postgresql://u.name:{MASK}@db.example.com:5432/x?sslmode=require"),
        (f"see http://a:{CANARY}@h:1/v1?api_key={CANARY} now", f"see http://a:{MASK}@h:1/v1?api_key={MASK} now"),
    ],
)  # fmt: skip
def test_the_password_of_a_uri_is_masked_wherever_the_uri_is(uri: str, masked: str) -> None:
    assert mask_uri(uri) == masked


def test_a_uri_masked_inside_json_or_repr_text_stays_well_formed() -> None:
    row = {"error": json.dumps({"url": f"http://h/v1?api_key={CANARY}"}), "other": f"'x?token={CANARY}'"}
    masked = mask_uri(json.dumps(row))
    assert CANARY not in masked
    assert json.loads(json.loads(masked)["error"]) == {"url": f"http://h/v1?api_key={MASK}"}


def test_key_variables_and_values_handed_over_as_credentials_are_secrets() -> None:
    assert is_secret_name("LLM_KEY") and is_secret_name("OPENROUTER_API_KEY") and is_secret_name("DB_PASSWD")
    assert not is_secret_name("LLM_ACCESS") and not is_secret_name("HOME")
    assert secret_values({"LLM_KEY": CANARY, "LLM_ACCESS": "not-a-credential-name"}) == [CANARY]
    remember_secret("remembered-0123456789")
    remember_secret("short")  # too short to mask without masking ordinary words
    assert "remembered-0123456789" in secret_values() and "short" not in secret_values()
    assert redact("the key remembered-0123456789 was refused") == f"the key {MASK} was refused"


def test_a_key_in_the_endpoint_url_is_masked_in_the_resolved_config() -> None:
    cfg = load_config(None, [f"inference.endpoint.base_url=http://user:{CANARY}@h:8000/v1?api_key={CANARY}"])
    text = dump_config(cfg)
    assert CANARY not in text and f"http://user:{MASK}@h:8000/v1?api_key={MASK}" in text


def test_an_inline_credential_refused_in_k8s_env_is_not_shown() -> None:
    with pytest.raises(ConfigError, match=r"HF_TOKEN.*hold credentials") as error:
        load_config(None, [f"k8s.env={{HF_TOKEN: {CANARY}, LOG_LEVEL: debug}}"])
    assert CANARY not in str(error.value) and "'LOG_LEVEL': 'debug'" in str(error.value)


def test_the_file_writers_mask_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", CANARY)
    report = write_text_atomic(tmp_path / "report.html", f"<p>{CANARY} at http://h/?sig={CANARY}</p>")
    assert report.read_text() == f"<p>{MASK} at http://h/?sig={MASK}</p>"
    echoed = 'HTTP 401: {{"message": "Incorrect API key provided: {}"}}'
    lines = write_jsonl_atomic(tmp_path / "out.jsonl", [{"error": echoed.format(CANARY)}]).read_text().splitlines()
    assert [json.loads(line)["error"] for line in lines] == [echoed.format(MASK)]


def test_stage_records_and_rendered_manifests_are_written_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft.deploy.writer import write_manifests
    from rayft.runs.records import StageRecord, write_record

    monkeypatch.setenv("HF_TOKEN", CANARY)
    uri = f"http://h:8000/v1?api_key={CANARY}"
    record = write_record(tmp_path, StageRecord("eval", "f" * 8, {"endpoint": uri}, {}, {"note": CANARY}))
    manifest = {"kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"url": uri, "token": CANARY}}
    (written,) = write_manifests([manifest], tmp_path / "k8s")
    for path in (record, written):
        text = path.read_text()
        assert CANARY not in text and MASK in text, text


def test_an_endpoint_that_echoes_the_key_leaves_it_in_no_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    key = "hf_CANARYSECRET123-unit"  # in a variable whose name says nothing of a credential
    monkeypatch.setenv("LLM_ACCESS", key)
    with OpenAIServer(responder=lambda request: "unused", api_key="the-right-key") as server:
        url = f"{server.base_url}?api_key={CANARY}"
        backend = OpenAIBackend("gpt-x", EndpointConfig(base_url=server.base_url, api_key_env="LLM_ACCESS",
                                                        max_retries=0))  # fmt: skip
        (generation,) = backend.generate(["hi"], SamplingParams(max_new_tokens=4))
        assert server.statuses == [401]
        assert generation.error is not None and "Incorrect API key provided" in generation.error
        assert key not in generation.error and MASK in generation.error
        assert CANARY not in OpenAIBackend("gpt-x", EndpointConfig(base_url=url)).name


def run_python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_TOKEN": CANARY, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_once_installed_logs_tracebacks_prints_and_the_log_file_are_masked(tmp_path: Path) -> None:
    code = f"""
import logging, sys
from pathlib import Path
from rayft.console import attach_log_file, setup_console
from rayft.runs.layout import LOG_FILE
from rayft.security import install_redaction
install_redaction()
setup_console()
attach_log_file(Path("run") / LOG_FILE)
log = logging.getLogger("rayft.test")
log.warning("token %s", "{CANARY}")
logging.getLogger("ray").error("url http://h/v1?api_key=abcdefgh123")
try:
    raise RuntimeError("server said {CANARY}")
except RuntimeError:
    log.exception("failed")
print("printed {CANARY}")
sys.stderr.write("written {CANARY}\\n")
import click
from rich.console import Console
click.echo("echoed {CANARY}")
click.secho("styled {CANARY}", err=True, fg="red")
Console(stderr=True).print("rich {CANARY}")
raise SystemExit("exit {CANARY}")
"""
    done = run_python(code, tmp_path)
    log_file = (tmp_path / "run" / "logs" / "rayft.log").read_text()
    for text in (done.stdout, done.stderr, log_file):
        assert CANARY not in text and "abcdefgh123" not in text
    assert f"printed {MASK}" in done.stdout and f"echoed {MASK}" in done.stdout
    for shown in (f"RuntimeError: server said {MASK}", f"styled {MASK}", f"rich {MASK}", f"exit {MASK}"):
        assert shown in done.stderr
    assert f"token {MASK}" in log_file and f"RuntimeError: server said {MASK}" in log_file


def test_the_cli_and_the_python_api_install_redaction(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("name: x\n")
    cli = subprocess.run(
        [sys.executable, "-m", "rayft", "config", "show", "c.yaml", f"model.name=http://h/m?token={CANARY}",
         f"k8s.env={{HF_TOKEN: other-{CANARY}}}"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert cli.returncode == 2 and "Error:" in cli.stderr and CANARY not in cli.stdout + cli.stderr
    api = run_python(
        "import logging, sys, rayft\n"
        "try:\n    rayft.api.export(rayft.RayftConfig(), 'no-such-run', 'out')\n"
        "except rayft.RayftError as exc:\n    print(exc)\n"
        f"print('{CANARY}')\n",
        tmp_path,
    )
    assert f"{MASK}" in api.stdout and CANARY not in api.stdout + api.stderr, api.stderr


def test_ray_records_the_command_line_of_the_driver_masked(tmp_path: Path) -> None:
    code = """
import sys
import ray._private.utils
from rayft._ray_private import mask_job_entrypoint
mask_job_entrypoint()
open("entrypoint.txt", "w").write(ray._private.utils.get_entrypoint_name())  # what ray.init records
"""
    done = subprocess.run(
        [sys.executable, "-c", code, f"inference.endpoint.base_url=http://h/v1?api_key={CANARY}"], cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "entrypoint.txt").read_text().endswith(f"base_url=http://h/v1?api_key={MASK}")
