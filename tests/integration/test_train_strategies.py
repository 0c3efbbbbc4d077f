"""FSDP and DeepSpeed ZeRO-3 (``train.strategy``) on 2 Ray Train workers (gloo, CPU) on a tiny random
model: full fine-tuning under DDP changes and saves the whole model; FSDP and DeepSpeed each train
as DDP does, their checkpoints hold whole weights (never one rank's shard), a
killed FSDP worker resumes exactly, and runs resume across strategies (DDP to FSDP, DDP to
DeepSpeed, DeepSpeed to DDP). The slow tier adds DeepSpeed runs trained whole (with and without
offload) and DDP runs that really fail before they resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayft.data.prepared import PreparedData
from rayft.errors import TrainingError
from tests.support.kills import kill_a_worker_at
from tests.support.runs import adapter_tensors, crashed_copy, read_metrics, tiny_config, train_losses, train_on

pytestmark = pytest.mark.integration

# 64 units, 2 workers x 4 per micro-batch: 8 steps per epoch.
LORA = ("train.max_steps=8", "train.save_steps=4", "train.eval_steps=4")
FSDP = "train.strategy=fsdp"
DEEPSPEED = "train.strategy=deepspeed"
FULL = ("train.method=full", "train.max_steps=3", "train.save_steps=2", "train.eval_steps=null",
        "train.learning_rate=1e-3")  # fmt: skip


@pytest.fixture(scope="module")
def prepared(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    from rayft.config import ModelConfig
    from rayft.models.loading import load_tokenizer
    from rayft.testing.units import arithmetic_prepared

    tokenizer = load_tokenizer(ModelConfig(name=str(tiny_model_dir)))
    return arithmetic_prepared(tmp_path_factory.mktemp("units"), tokenizer, num_train=64, num_validation=9)


@pytest.fixture(scope="module")
def ddp_run(ray_session: None, tiny_model_dir: Path, prepared: PreparedData, tmp_path_factory: Any) -> Path:
    return train_on(tiny_config(tiny_model_dir, tmp_path_factory.mktemp("ddp"), *LORA), prepared)


@pytest.fixture(scope="module")
def fsdp_run(ray_session: None, tiny_model_dir: Path, prepared: PreparedData, tmp_path_factory: Any) -> Path:
    return train_on(tiny_config(tiny_model_dir, tmp_path_factory.mktemp("fsdp"), *LORA, FSDP), prepared)


@pytest.fixture(scope="module")
def ddp_full_run(ray_session: None, tiny_model_dir: Path, prepared: PreparedData, tmp_path_factory: Any) -> Path:
    return train_on(tiny_config(tiny_model_dir, tmp_path_factory.mktemp("ddp-full"), *FULL), prepared)


def eval_losses(run_dir: Path) -> dict[int, float]:
    """Validation loss by step."""
    return {r["step"]: r["eval/loss"] for r in read_metrics(run_dir) if "eval/loss" in r}


def assert_close_runs(got: Path, want: Path, *, rel: float = 1e-4) -> None:
    """Same steps, training and validation losses within ``rel``, adapters within 1e-5.

    Why these hold on any CPU: both runs compute the same float32 gradients, summed over workers, micro-batches
    or flattened shards in another order, so they differ by ~1e-6 relative. Adam's update (m / sqrt(v)) does
    not scale with the gradient: a relative change of 1e-6 in a gradient moves its update by ~1e-6 of the
    update, at most lr = 3e-3 per step: the adapters part by ~1e-8 over these runs' <= 8 steps, well under
    1e-5, and the losses, computed from those weights, by far less than 1e-4 relative. A strategy that drops
    or doubles a worker's gradient parts them by the update itself (~lr = 3e-3)."""
    for read in (train_losses, eval_losses):
        a, b = read(got), read(want)
        assert a.keys() == b.keys()
        for step in a:
            assert a[step] == pytest.approx(b[step], rel=rel), (read.__name__, step)
    got_weights, want_weights = adapter_tensors(got / "final"), adapter_tensors(want / "final")
    assert got_weights.keys() == want_weights.keys()
    for name, tensor in want_weights.items():
        assert got_weights[name].shape == tensor.shape, name
        assert (got_weights[name] - tensor).abs().max() < 1e-5, name


def test_fsdp_lora_trains_as_ddp_and_saves_whole_adapters(fsdp_run: Path, ddp_run: Path, tiny_model_dir: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rayft.export.checks import check_adapter
    from rayft.runs.manifest import verify_checkpoint

    assert_close_runs(fsdp_run, ddp_run)
    # 9 validation units over 2 workers: one worker evaluates a batch more; the other waits in step.
    assert len(eval_losses(fsdp_run)) == 2
    for directory in [*sorted((fsdp_run / "checkpoints").glob("step-*")), fsdp_run / "final"]:
        assert verify_checkpoint(directory) == []
        problems, summary = check_adapter(directory, expected_r=4)
        assert problems == [] and summary is not None, directory
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), fsdp_run / "final")
    tokenizer = AutoTokenizer.from_pretrained(fsdp_run / "final")
    ids = tokenizer("Question: 2 + 2\nAnswer: ", return_tensors="pt")["input_ids"]
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] > ids.shape[1]


def test_fsdp_resume_after_a_worker_is_killed_matches_an_uninterrupted_run(
    fsdp_run: Path, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    seen: list[int] = []
    watcher = kill_a_worker_at(run_dir, 5, seen, monkeypatch)
    train_on(tiny_config(tiny_model_dir, tmp_path, *LORA, FSDP), prepared)
    watcher.join(timeout=5)

    assert seen, "no worker was killed"
    assert train_losses(run_dir) == train_losses(fsdp_run)  # bitwise, every step
    assert [r["step"] for r in read_metrics(run_dir) if "train/loss" in r] == list(range(1, 9))
    want = adapter_tensors(fsdp_run / "final")
    assert all(adapter_tensors(run_dir / "final")[name].equal(t) for name, t in want.items())


def fail_at_step_6(
    tiny_model_dir: Path, prepared: PreparedData, storage: Path, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Train under ``strategy`` until an injected failure before step 6 (after the checkpoint of step 4)."""
    monkeypatch.setenv("RAYFT_FAULT_RAISE", "0:6")
    with pytest.raises(TrainingError, match="injected failure on rank 0 at step 6"):
        train_on(tiny_config(tiny_model_dir, storage, *LORA, strategy, "failure.max_failures=0"), prepared)
    monkeypatch.delenv("RAYFT_FAULT_RAISE")
    assert (storage / "run" / "checkpoints" / "step-000004").is_dir()


def assert_whole_adapters(*directories: Path) -> None:
    """Each directory holds the whole adapter (every rank's part, rank r = 4), never one rank's shard."""
    from rayft.export.checks import check_adapter

    for directory in directories:
        problems, summary = check_adapter(directory, expected_r=4)
        assert problems == [] and summary is not None, directory


OFFLOAD = "train.deepspeed={zero_optimization: {offload_optimizer: {device: cpu}}}"


# The DDP side of a crash is the DDP reference run cut back to its checkpoint of step 4 (what a
# DDP run that died before step 6 leaves; the slow tier's variant below makes it fail for real).
@pytest.mark.parametrize("resumed_under", [FSDP, DEEPSPEED], ids=["ddp-to-fsdp", "ddp-to-deepspeed"])
def test_a_ddp_run_resumes_under_a_sharded_strategy(
    ddp_run: Path, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path, resumed_under: str
) -> None:
    crashed_copy(ddp_run, tmp_path, crashed_at=6)
    resumed = train_on(tiny_config(tiny_model_dir, tmp_path, *LORA, resumed_under), prepared, resume=True)

    assert_close_runs(resumed, ddp_run)
    assert_whole_adapters(resumed / "checkpoints" / "step-000008", resumed / "final")


def test_a_deepspeed_run_trains_as_ddp_saves_whole_adapters_and_resumes_under_ddp(
    ddp_run: Path, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_at_step_6(tiny_model_dir, prepared, tmp_path, DEEPSPEED, monkeypatch)
    assert_whole_adapters(tmp_path / "run" / "checkpoints" / "step-000004")  # saved by DeepSpeed
    resumed = train_on(tiny_config(tiny_model_dir, tmp_path, *LORA, "train.strategy=ddp"), prepared, resume=True)

    assert_close_runs(resumed, ddp_run)  # steps 1-5 under DeepSpeed, 5-8 under DDP


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategies",
    [("train.strategy=ddp", FSDP), ("train.strategy=ddp", DEEPSPEED)],
    ids=["ddp-to-fsdp", "ddp-to-deepspeed"],
)
def test_a_run_that_failed_under_ddp_resumes_under_another_strategy(  # noqa: PLR0917 - fixtures
    ddp_run: Path, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    strategies: tuple[str, str],
) -> None:  # fmt: skip
    """The slow tier's variant of the resumes above: the DDP run really fails at step 6."""
    saved_under, resumed_under = strategies
    fail_at_step_6(tiny_model_dir, prepared, tmp_path, saved_under, monkeypatch)
    resumed = train_on(tiny_config(tiny_model_dir, tmp_path, *LORA, resumed_under), prepared, resume=True)

    assert_close_runs(resumed, ddp_run)


# DeepSpeed's offload options are its engine's business: rayft runs the same code with or without
# them (torch's AdamW, the same state gathering), so the default tiers run DeepSpeed without them.
@pytest.mark.slow
@pytest.mark.parametrize("engine", [(), (OFFLOAD,)], ids=["default", "optimizer-offload"])
def test_deepspeed_lora_trains_as_ddp_and_saves_whole_adapters(
    ddp_run: Path, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path, engine: tuple[str, ...]
) -> None:
    """Every step under DeepSpeed (the default tiers split it between the two resumes above)."""
    run_dir = train_on(tiny_config(tiny_model_dir, tmp_path, *LORA, DEEPSPEED, *engine), prepared)

    assert_close_runs(run_dir, ddp_run)
    assert_whole_adapters(*sorted((run_dir / "checkpoints").glob("step-*")), run_dir / "final")


def test_full_fine_tuning_on_two_workers_changes_and_saves_the_whole_model(
    ddp_full_run: Path, tiny_model_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    assert sorted(train_losses(ddp_full_run)) == [1, 2, 3]
    final = ddp_full_run / "final"
    assert (final / "model.safetensors").is_file() and not (final / "adapter_config.json").exists()
    tuned = AutoModelForCausalLM.from_pretrained(final)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    moved = [n for n, p in tuned.named_parameters() if not p.detach().equal(dict(base.named_parameters())[n])]
    assert moved, "full fine-tuning changed no weight"


@pytest.mark.parametrize("strategy", [FSDP, DEEPSPEED])
def test_full_fine_tuning_trains_as_ddp_and_saves_the_whole_model(
    ddp_full_run: Path, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path, strategy: str
) -> None:
    from safetensors.torch import load_file

    run_dir = train_on(tiny_config(tiny_model_dir, tmp_path, *FULL, strategy), prepared)

    a, b = train_losses(run_dir), train_losses(ddp_full_run)
    assert a.keys() == b.keys() == {1, 2, 3}
    assert all(a[step] == pytest.approx(b[step], rel=1e-4) for step in a)
    for directory in ("checkpoints/step-000002", "final"):
        got = load_file(str(run_dir / directory / "model.safetensors"))
        want = load_file(str(ddp_full_run / directory / "model.safetensors"))
        assert got.keys() == want.keys()
        for name, tensor in want.items():
            assert got[name].shape == tensor.shape, name
            assert (got[name] - tensor).abs().max() < 1e-5, name
