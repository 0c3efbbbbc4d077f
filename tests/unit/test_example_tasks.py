"""The custom-task examples' configs validate and their tasks load with the configured options;
the CIFAR-10 config is for a GPU cluster and is only validated here."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.custom import load_task
from rayft.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _task(config: Path) -> object:
    cfg = load_config(config)
    assert cfg.task.path is not None
    target, _, name = cfg.task.path.rpartition(":")
    return load_task(f"{EXAMPLES.parent / target}:{name}", cfg.task.options)


def test_digits_config_runs_two_ddp_workers_and_its_model_classifies_8x8_digits() -> None:
    import torch

    cfg = load_config(EXAMPLES / "digits_cnn" / "digits.yaml")
    assert cfg.scaling.num_workers == 2 and cfg.train.strategy == "ddp"
    task = _task(EXAMPLES / "digits_cnn" / "digits.yaml")
    logits = task.build_model()(torch.zeros(3, 1, 8, 8))  # type: ignore[attr-defined]
    assert logits.shape == (3, 10)


def test_digits_task_refuses_a_width_its_norms_cannot_split() -> None:
    with pytest.raises(ConfigError, match=r"width=6: use a positive multiple of 4"):
        load_task(f"{EXAMPLES / 'digits_cnn' / 'task.py'}:DigitsTask", {"width": 6})


def test_cifar10_resnet50_config_is_a_gpu_cluster_run() -> None:
    cfg = load_config(EXAMPLES / "cifar10_resnet" / "cifar10-resnet50.yaml")
    assert cfg.scaling.use_gpu is True and cfg.scaling.num_workers == 4
    assert cfg.scaling.resources_per_worker == {"CPU": 8, "GPU": 1} and cfg.train.mixed_precision == "bf16"
    task = _task(EXAMPLES / "cifar10_resnet" / "cifar10-resnet50.yaml")
    assert task.sync_batchnorm and task.data_dir == "/mnt/shared/datasets/cifar10"  # type: ignore[attr-defined]
