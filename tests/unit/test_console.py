"""The console: which records it shows, the progress line, and the note beside built-in evaluations."""

from __future__ import annotations

import logging
import math

import pytest

from rayft.console import ConsoleFilter, RayInfoFilter, progress_line
from rayft.data.builtin import builtin_eval_note


def _record(name: str, level: int, pathname: str = "x.py") -> logging.LogRecord:
    return logging.LogRecord(name, level, pathname, 1, "msg", None, None)


def test_console_shows_rayft_lines_and_others_warnings_only() -> None:
    quiet, verbose = ConsoleFilter(False), ConsoleFilter(True)
    assert quiet.filter(_record("rayft.train", logging.INFO))
    assert not quiet.filter(_record("ray.data", logging.INFO))
    assert quiet.filter(_record("ray.data", logging.WARNING))
    assert verbose.filter(_record("ray.data", logging.INFO))


def test_ray_info_filter_keys_on_where_the_record_was_logged() -> None:
    drop = RayInfoFilter("/site/ray")
    assert not drop.filter(_record("/site/ray/train/context.py", logging.INFO, "/site/ray/train/context.py"))
    assert drop.filter(_record("x", logging.WARNING, "/site/ray/train/context.py"))
    assert drop.filter(_record("rayft.train", logging.INFO, "/src/rayft/training/loop/metrics.py"))
    # Ray Train's copy of a training function's error: the driver reports it, its traceback in the run's log.
    reported = logging.LogRecord("ray.train.v2._internal.util", logging.ERROR, "/site/ray/train/v2/_internal/util.py",
                                 1, "Error in training function:\nTraceback ...", None, None)  # fmt: skip
    assert not drop.filter(reported)
    assert drop.filter(_record("x", logging.ERROR, "/site/ray/train/context.py"))


def test_a_record_for_the_log_file_alone_stays_off_the_console() -> None:
    record = _record("rayft.train", logging.INFO)
    record.rayft_file_only = True
    assert not ConsoleFilter(False).filter(record) and not ConsoleFilter(True).filter(record)


def test_progress_line_has_rate_and_eta() -> None:
    assert progress_line("eval base", 40, 200, 20.0, "prompts") == (
        "eval base: 40/200 prompts (20%), 2.00 prompts/s, 0m20s elapsed, eta 1m20s"
    )
    assert progress_line("sdg", 0, 10, 0.0, "seeds").endswith("? seeds/s, 0m00s elapsed, eta ?")


def test_builtin_eval_note() -> None:
    note = builtin_eval_note(["builtin:arithmetic"], ["builtin:arithmetic"])
    assert note is not None and "not a GSM8K result" in note and "training data also came from" in note
    assert builtin_eval_note(["/data/gsm8k/test.jsonl"]) is None


def test_one_duration_format_for_console_progress_and_training_eta(caplog: pytest.LogCaptureFixture) -> None:
    from rayft.console import clock
    from rayft.training.loop.metrics import ConsoleLogger

    assert [clock(s) for s in (0.4, 59.6, 65.0, -1.0, math.nan)] == ["0m00s", "1m00s", "1m05s", "?", "?"]
    assert progress_line("eval", 1, 2, 59.6, "prompts").endswith("1m00s elapsed, eta 1m00s")
    logger = ConsoleLogger(total_steps=2, start_step=0)
    logger._start -= 59.6  # one step took 59.6 s: one more to go
    with caplog.at_level(logging.INFO, logger="rayft.train"):
        logger.log(1, {"train/loss": 1.0, "train/tokens_per_s": 10.0})
    assert caplog.records[-1].getMessage().endswith("eta 1m00s")


def test_a_grpo_step_line_shows_the_reward_and_pass_rate(caplog: pytest.LogCaptureFixture) -> None:
    from rayft.training.loop.metrics import ConsoleLogger

    logger = ConsoleLogger(total_steps=3, start_step=0)
    with caplog.at_level(logging.INFO, logger="rayft.train"):
        logger.log(1, {"train/loss": 0.0, "train/tokens_per_s": 10.0, "rl/reward": 0.25, "rl/pass@1": 0.125})
        logger.log(2, {"train/loss": 0.5, "train/tokens_per_s": 10.0})
    assert "loss 0.0000  reward 0.250  pass@1 0.125  lr" in caplog.records[-2].getMessage()
    assert "reward" not in caplog.records[-1].getMessage()


def test_a_dynamic_sampling_step_line_shows_its_groups(caplog: pytest.LogCaptureFixture) -> None:
    from rayft.training.loop.metrics import ConsoleLogger

    logger = ConsoleLogger(total_steps=3, start_step=0)
    record = {"rl/groups_drawn": 13.0, "rl/groups_dropped": 5.0, "rl/extra_rollouts": 32.0, "rl/short_steps": 1.0}
    with caplog.at_level(logging.INFO, logger="rayft.train"):
        logger.log(1, {"train/loss": 0.0, "train/tokens_per_s": 10.0, "rl/reward": 0.25, "rl/pass@1": 0.125, **record})
    assert "pass@1 0.125  groups 8/13 (+32 rollouts, 1 short)  lr" in caplog.records[-1].getMessage()


def test_rays_cluster_errors_go_to_the_log_file_not_the_console(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The errors a Ray cluster pushes to its driver (a killed worker, Serve's controller task failing as Serve
    stops), which Ray's driver prints on stdout as `(raylet) ...`, are the run's log file's alone; a verbose run
    prints them as Ray does. Called here as Ray's error listener calls it."""
    import ray._private.worker as ray_worker

    from rayft.console import VERBOSE_ENV
    from rayft.runtime import keep_cluster_errors_off_console

    monkeypatch.setattr(ray_worker, "print_to_stdstream", ray_worker.print_to_stdstream)  # undone after the test
    monkeypatch.setenv(VERBOSE_ENV, "0")
    keep_cluster_errors_off_console()
    keep_cluster_errors_off_console()  # once is enough: a second call does not wrap it again
    died = "A worker died or was killed while executing a task by an unexpected system error. Lease ID: 01ab"
    shutdown = "Task ServeController.graceful_shutdown failed. There are infinite retries remaining"
    with caplog.at_level("WARNING"):
        ray_worker.print_to_stdstream(
            {"lines": [died, shutdown], "pid": "raylet", "is_err": False}, ignore_prefix=False
        )
        ray_worker.print_to_stdstream({"lines": ["step 3 loss 1.2"], "pid": 1234, "is_err": False}, ignore_prefix=True)
    printed = capsys.readouterr().out
    assert died not in printed and shutdown not in printed and "step 3 loss 1.2" in printed
    kept = [r for r in caplog.records if r.name == "rayft.ray"]
    assert [r.getMessage() for r in kept] == [died, shutdown] and all(r.rayft_file_only for r in kept)
    monkeypatch.setenv(VERBOSE_ENV, "1")
    ray_worker.print_to_stdstream({"lines": [died], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert died in capsys.readouterr().out


@pytest.mark.parametrize("module", ["rayft.models.loading", "rayft.testing"])
def test_deepspeeds_accelerator_notice_never_reaches_a_model_loading_process_output(module: str) -> None:
    """DeepSpeed warns "Setting accelerator to CPU" on its own stdout handler when anything imports it on a
    machine without a GPU (transformers' save_pretrained does, through accelerate, on every export): a process
    that loads or builds models (export, chat, a notebook building a tiny model) does not show it; what DeepSpeed
    warns otherwise still shows."""
    import subprocess
    import sys

    script = (
        f"import {module}\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "from deepspeed.utils import logger\n"
        "get_accelerator()\n"
        "logger.warning('a DeepSpeed warning that asks something of the user')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert "Setting accelerator to CPU" not in done.stdout + done.stderr
    assert "a DeepSpeed warning that asks something of the user" in done.stdout


def test_the_offline_kernel_trust_notice_never_reaches_a_model_loading_process_output() -> None:
    """Offline (HF_HUB_OFFLINE), bitsandbytes' import through PEFT makes Hugging Face's `kernels` warn that it
    skipped a kernel's publisher check: a process that loads models does not show it; what `kernels` warns
    otherwise still shows."""
    import os
    import subprocess
    import sys

    pytest.importorskip("bitsandbytes")
    script = (
        "import logging\n"
        "logging.basicConfig(format='%(name)s %(message)s')\n"
        "import rayft.models.loading\n"
        "import bitsandbytes\n"
        "logging.getLogger('kernels._internals.hf_hub').warning('a kernels warning that asks something of the user')\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120,
                          env=env)  # fmt: skip
    assert "Skipping publisher trust check" not in done.stdout + done.stderr
    assert "a kernels warning that asks something of the user" in done.stderr


def test_a_multi_turn_grpo_step_line_adds_turns_and_tool_calls(caplog: pytest.LogCaptureFixture) -> None:
    from rayft.training.loop.metrics import ConsoleLogger

    logger = ConsoleLogger(total_steps=3, start_step=0)
    figures = {"rl/reward": 0.5, "rl/pass@1": 0.5, "rl/episode/turns": 2.5, "rl/episode/tool_calls": 1.75}
    with caplog.at_level(logging.INFO, logger="rayft.train"):
        logger.log(1, {"train/loss": 0.0, "train/tokens_per_s": 10.0, **figures})
    assert "reward 0.500  pass@1 0.500  turns 2.50  tools 1.75  lr" in caplog.records[-1].getMessage()
