"""On-policy distillation end to end on a tiny random model: a run trained on a sharper teacher's
log-probabilities of its own samples, with no reward at all, records the per-token reverse KL and the teacher's
time every step (the term's value and gradient are checked against float64 in the unit tests), and the teacher
behind a real `rayft serve` gives the log-probabilities the in-process teacher computes for the same rows."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rayft
from rayft import api
from rayft.config import RayftConfig
from rayft.data.prepared import PreparedData
from tests.integration.test_train_rl import rl_config
from tests.support.runs import read_metrics, train_on

pytestmark = pytest.mark.integration

SHARPNESS = 20.0  # the teacher is the student at temperature 1/20: its logits are the student's times this


@pytest.fixture(scope="module")
def teacher_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The student's own weights with the final norm's scale times :data:`SHARPNESS`: every next-token
    distribution is the student's sharpened, far from the student's near-uniform one (a reverse KL of about 2
    nats per token) and one the student can reach (by scaling its logits up), with the student's tokenizer."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("teacher") / "teacher"
    shutil.copytree(tiny_model_dir, out)
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        model.model.norm.weight.mul_(SHARPNESS)
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def prompts(ray_session: None, tiny_model_dir: Path, tmp_path_factory: Any) -> PreparedData:
    from rayft.training.driver.startup import prepare_training_data

    return prepare_training_data(rl_config(tiny_model_dir, tmp_path_factory.mktemp("prep")), None, use_ray=True)


def test_a_run_distilled_from_a_teacher_alone_records_the_reverse_kl_per_step(
    tiny_model_dir: Path, teacher_dir: Path, prompts: PreparedData, tmp_path: Path
) -> None:
    cfg = rl_config(tiny_model_dir, tmp_path, "scaling.num_workers=0", "train.method=full", "train.max_steps=12",
                    "train.learning_rate=3e-2", "train.save_steps=12", "train.rl.rewards=[]",
                    f"train.rl.distillation={{teacher: '{teacher_dir}'}}")  # fmt: skip
    steps = [r for r in read_metrics(train_on(cfg, prompts)) if "train/loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 13))
    kl = [r["rl/distill/reverse_kl"] for r in steps]
    assert all(r["rl/distill/teacher_s"] > 0 for r in steps)
    assert not any(name.startswith("rl/reward") for name in steps[0])  # no reward configured, none logged
    # Each step's figure is the mean of log p_s - log p_t over its fresh samples before its update: a reverse KL
    # estimate, positive on average and far from 0 for a teacher this much sharper (about 6 nats per token here).
    assert all(math.isfinite(value) and value > 1.0 for value in kl), kl


@pytest.fixture(scope="module")
def served_teacher(ray_session: None, teacher_dir: Path) -> Iterator[rayft.ServeHandle]:
    cfg = RayftConfig.model_validate({"serve": {"max_batch_size": 8}})
    with api.serve(cfg, [str(teacher_dir)], port=0) as handle:
        yield handle


def test_a_served_teacher_gives_the_in_process_teachers_log_probabilities(
    served_teacher: rayft.ServeHandle, teacher_dir: Path, tiny_model_dir: Path
) -> None:
    import torch

    from rayft.config.rl import DistillationConfig
    from rayft.data.collate import collate
    from rayft.models.loading import load_tokenizer
    from rayft.training.methods.rl.distill import build_teacher, completion_unit

    student = rl_config(tiny_model_dir, Path("/unused")).model
    tokenizer = load_tokenizer(student)
    local = build_teacher(DistillationConfig(teacher=str(teacher_dir)), student, tokenizer, "cpu")
    endpoint = {"base_url": served_teacher.base_url, "api_key_env": None, "timeout_s": 60}
    remote = build_teacher(DistillationConfig(teacher=served_teacher.model_ids[0], endpoint=endpoint), student,
                           tokenizer, "cpu")  # fmt: skip
    texts = [("Question: 2 + 3?\nAnswer:", " 5"), ("SELECT", " name FROM table WHERE age = 30"), ("The", " fox")]
    units = [completion_unit(tokenizer(p)["input_ids"], tokenizer(c)["input_ids"]) for p, c in texts]
    rows = collate(units, int(tokenizer.pad_token_id), 1)
    want = local.logps(units, rows, torch.device("cpu"))
    got = remote.logps(units, rows, torch.device("cpu"))
    assert got.shape == want.shape and bool((want != 0).any())
    # Both are float32 forward passes of one model over the same ids (the server's unpadded, batched apart):
    # log-softmax values of magnitude ~10 agree within a few float32 ulps of the logits' reductions.
    assert torch.allclose(got, want, atol=1e-3), (got, want)
    remote.close()
