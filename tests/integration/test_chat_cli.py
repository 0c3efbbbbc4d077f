"""`rayft chat` driven through its real command line, stdin piped, on a tiny model's run directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rayft.config import dump_config, load_config
from rayft.config.model import ModelConfig
from rayft.generation.backend import SamplingParams
from rayft.generation.hf import HFBackend
from rayft.runs import layout
from tests.support.checkpoints import build_full_checkpoint

pytestmark = pytest.mark.integration

SYSTEM = "You answer in one word."


def _expected_replies(final_dir: Path, params: SamplingParams) -> list[str]:
    """What the session must print: each reply generated (not streamed) from the conversation so far."""
    backend = HFBackend(ModelConfig(name=str(final_dir)), device="cpu", batch_size=1)
    conversations = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "what is 12 + 7?"}],
    ]
    first = backend.generate([conversations[1]], params)[0].text
    conversations.append(
        [*conversations[1], {"role": "assistant", "content": first}, {"role": "user", "content": "why?"}]
    )
    conversations.append([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "again"}])
    return [backend.generate([c], params)[0].text for c in conversations]


def test_chat_session_over_stdin(tmp_path: Path, tiny_model_dir: Path) -> None:
    run_dir = tmp_path / "run"
    build_full_checkpoint(run_dir / layout.FINAL_DIR, tiny_model_dir)  # a finished run's final/
    (run_dir / layout.CONFIG_FILE).write_text(dump_config(load_config(None, ["train.method=full"])), encoding="utf-8")
    params = SamplingParams(max_new_tokens=6, temperature=1.0, top_p=1.0, seed=3)
    lines = [
        "hi",
        f"/system {SYSTEM}",
        "/system",
        "what is 12 + 7?",
        "why?",
        "/reset",
        "/nope",
        "again",
        "/exit",
        "never",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "rayft", "chat", str(run_dir), "--max-new-tokens", "6", "--temperature", "1",
               "--top-p", "1", "--seed", "3", "--device", "cpu"]  # fmt: skip
    done = subprocess.run(
        command, input="\n".join(lines) + "\n", capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    # The final/ checkpoint is the one chatted with; replies go to stdout, one block each, in order.
    assert done.stdout == "".join(reply + "\n" for reply in _expected_replies(run_dir / "final", params))
    for note in (
        f"Chatting with {(run_dir / 'final').resolve()}",
        "(system prompt set; conversation cleared)",
        f"system prompt: '{SYSTEM}'",
        "(conversation cleared)",
        "unknown command '/nope'",
    ):
        assert note in done.stderr
    assert "never" not in done.stdout + done.stderr.split("unknown command")[-1]


def test_ctrl_c_stops_the_reply_not_the_session(tiny_model_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # Greedy, the tiny model never emits EOS: only Ctrl-C can end this reply before 2000 tokens.
    command = [sys.executable, "-m", "rayft", "chat", str(tiny_model_dir), "--temperature", "0",
               "--max-new-tokens", "2000", "--device", "cpu"]  # fmt: skip
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    ) as chat:
        assert chat.stdin is not None and chat.stdout is not None and chat.stderr is not None
        chat.stdin.write(b"hi\n")
        chat.stdin.flush()
        first = chat.stdout.read(8)  # eight characters of the reply have streamed: it is generating
        chat.send_signal(signal.SIGINT)
        chat.stdin.write(b"/system\n/exit\n")
        chat.stdin.close()
        assert chat.wait(timeout=60) == 0
        stdout, stderr = first + chat.stdout.read(), chat.stderr.read().decode()
    assert "line discarded" not in stderr, stderr  # the Ctrl-C reached the reply, not the prompt
    assert "(reply stopped)" in stderr and "system prompt: none" in stderr, stderr
    assert 0 < len(stdout) < 2000
