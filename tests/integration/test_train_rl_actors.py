"""GRPO with rollouts on Ray generation actors apart from the trainer, on a tiny random model: synchronous
actors sample exactly what colocated rollouts sample (so the losses are equal), on one in-process trainer
and on 2 Ray Train workers; a weight sync an actor never answers ends the run within its timeout; several
updates per rollout clip; asynchronous rollouts are one step stale."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from rayft.errors import TrainingError
from rayft.training.methods.rl.rollout_actors import ActorSpec, HfRolloutActor, WeightUpdate
from tests.integration.test_train_rl import BUILTIN_REWARDS, figures, prompts, rl_config
from tests.support.runs import crashed_copy, read_metrics, train_losses, train_on

pytestmark = pytest.mark.integration
__all__ = ["prompts"]  # the prepared prompts, shared with the colocated tests

RUN = (BUILTIN_REWARDS, "train.max_steps=3", "train.save_steps=3", "train.learning_rate=5e-2")
ACTORS = ("train.rl.rollout.placement=actors", "train.rl.rollout.start_timeout_s=120",
          "train.rl.rollout.sync_timeout_s=120", "train.rl.rollout.generate_timeout_s=120")  # fmt: skip


class SilentSyncActor(HfRolloutActor):
    """A generation actor that takes the first weights, then never answers a weight sync: its
    ``load_weights`` blocks for good, as an actor stuck in a hung transfer does."""

    def load_weights(self, update: WeightUpdate) -> int:
        if update.version > 0:
            threading.Event().wait()
        return super().load_weights(update)


def by_value() -> None:
    """Ship this module's classes to Ray's workers by value (the tests' directory is not on their path)."""
    import sys

    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def records(run_dir: Path, name: str) -> dict[int, float]:
    return {r["step"]: r[name] for r in read_metrics(run_dir) if "train/loss" in r}


# With the frozen layers in bf16 the actors build theirs in bf16 too (the updates carry only the adapter).
@pytest.mark.parametrize(("actors", "setting"), [
    (2, ("train.method=lora",)), (1, ("train.method=lora", "train.frozen_precision=bf16")), (1, ("train.method=full",)),
])  # fmt: skip
def test_synchronous_actors_sample_what_colocated_rollouts_sample(
    tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path, actors: int, setting: tuple[str, ...]
) -> None:
    common = (*RUN, "scaling.num_workers=0", *setting, "train.gradient_accumulation_steps=2")
    colocated = train_on(rl_config(tiny_model_dir, tmp_path / "colocated", *common), prompts)
    on_actors = train_on(rl_config(tiny_model_dir, tmp_path / "actors", *common, *ACTORS,
                                   f"train.rl.rollout.num_actors={actors}"), prompts)  # fmt: skip
    want, got = train_losses(colocated), train_losses(on_actors)
    assert list(want) == [1, 2, 3] and want.keys() == got.keys()
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
    for step, values in figures(on_actors).items():
        assert values == pytest.approx(figures(colocated)[step], rel=1e-5, abs=1e-7), step
    assert set(records(on_actors, "rl/staleness").values()) == {0.0}
    assert any(values["rl/reward_std"] > 0 for values in figures(colocated).values())  # the groups teach something


def test_actors_of_two_ray_train_workers_sample_what_colocated_workers_sample(
    tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path
) -> None:
    colocated = train_on(rl_config(tiny_model_dir, tmp_path / "colocated", *RUN), prompts)
    # The 2 CPUs of the test's Ray hold the 2 training workers; the actors take none.
    on_actors = train_on(rl_config(tiny_model_dir, tmp_path / "actors", *RUN, *ACTORS, "train.rl.rollout.num_actors=2",
                                   "train.rl.rollout.num_cpus_per_actor=0"), prompts)  # fmt: skip
    assert train_losses(on_actors) == pytest.approx(train_losses(colocated), rel=1e-5, abs=1e-7)


def test_a_generation_actor_of_a_run_on_an_unquantized_base_never_loads_bitsandbytes(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("bitsandbytes", reason="the qlora extra: pip install 'rayft[qlora]'")
    import ray

    cfg = rl_config(tiny_model_dir, tmp_path, *RUN)
    spec = ActorSpec(cfg.model, cfg.lora, cfg.train.method, cfg.train.rl)
    actor = ray.remote(HfRolloutActor).options(num_cpus=0).remote(spec)
    try:
        assert ray.get(actor.ready.remote(), timeout=120)  # its LoRA model built through PEFT
        pid = ray.get(actor.__ray_call__.remote(lambda _: os.getpid()), timeout=60)
        maps = Path(f"/proc/{pid}/maps").read_text()  # bitsandbytes' import loads its native library
    finally:
        ray.kill(actor)
    assert "bitsandbytes" not in maps


def test_a_weight_sync_that_never_completes_ends_the_run_within_its_timeout(
    tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path
) -> None:
    by_value()
    cfg = rl_config(tiny_model_dir, tmp_path, *RUN, "scaling.num_workers=0", *ACTORS,
                    "train.rl.rollout.sync_timeout_s=3",
                    f"train.rl.rollout.actor_class={__name__}:SilentSyncActor")  # fmt: skip
    with pytest.raises(TrainingError) as raised:
        train_on(cfg, prompts)
    message = str(raised.value)
    assert message == (
        "the weight sync of step 1 to the generation actors did not finish within 3 s "
        "(train.rl.rollout.sync_timeout_s); raise train.rl.rollout.sync_timeout_s if that is too short; likely "
        "cause: an actor that is busy or hangs, or weights too large for the object store's bandwidth"
    )
    assert records(tmp_path / "run", "train/loss").keys() == {1}  # step 1 trained; its sync never came back


def test_several_updates_per_rollout_clip_the_ratio_after_the_first(
    tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path
) -> None:
    common = (*RUN, "scaling.num_workers=0", "train.method=full", "train.learning_rate=2e-2")
    once = train_on(rl_config(tiny_model_dir, tmp_path / "once", *common), prompts)
    four = train_on(rl_config(tiny_model_dir, tmp_path / "four", *common, "train.rl.steps_per_rollout=4"), prompts)
    assert set(records(once, "rl/clip_fraction").values()) == {0.0}  # on-policy: the ratio is 1
    assert max(records(four, "rl/clip_fraction").values()) > 0  # updates 2-4 move the ratio past 1 + epsilon
    assert train_losses(four)[1] != pytest.approx(train_losses(once)[1], rel=1e-6)  # the mean of 4 updates


def test_asynchronous_rollouts_are_sampled_one_step_ahead(
    tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path
) -> None:
    common = (*RUN, "scaling.num_workers=0", *ACTORS)
    sync = train_on(rl_config(tiny_model_dir, tmp_path / "sync", *common), prompts)
    stale = train_on(rl_config(tiny_model_dir, tmp_path / "async", *common, "train.rl.rollout.max_staleness=1"),
                     prompts)  # fmt: skip
    assert records(stale, "rl/staleness") == {1: 0.0, 2: 1.0, 3: 1.0}
    # Step 1 and step 2's samples come from the same (initial) weights in the asynchronous run.
    assert train_losses(stale)[1] == pytest.approx(train_losses(sync)[1], rel=1e-6)
    assert train_losses(stale)[2] != pytest.approx(train_losses(sync)[2], rel=1e-6)
    # Stale steps weigh each token by the policy's probability over the sampling weights' (at most 2).
    weights = records(stale, "rl/importance_weight")
    assert weights[1] == 1.0
    assert all(0.0 < weights[step] <= 2.0 and weights[step] != pytest.approx(1.0, abs=1e-6) for step in (2, 3))
    plain = train_on(rl_config(tiny_model_dir, tmp_path / "plain", *common, "train.rl.rollout.max_staleness=1",
                               "train.rl.rollout.importance_cap=null"), prompts)  # fmt: skip
    assert records(plain, "rl/staleness") == {1: 0.0, 2: 1.0, 3: 1.0}
    assert not any("rl/importance_weight" in record for record in read_metrics(plain))
    assert train_losses(plain)[1] == pytest.approx(train_losses(stale)[1], rel=1e-6)
    assert train_losses(plain)[2] != pytest.approx(train_losses(stale)[2], rel=1e-6)


def test_an_asynchronous_run_resumed_from_a_checkpoint_equals_the_uninterrupted_run(
    tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path
) -> None:
    run = (BUILTIN_REWARDS, "train.max_steps=4", "train.save_steps=2", "train.learning_rate=5e-2",
           "scaling.num_workers=0", *ACTORS, "train.rl.rollout.max_staleness=1")  # fmt: skip
    whole = train_on(rl_config(tiny_model_dir, tmp_path / "whole", *run), prompts)
    crashed_copy(whole, tmp_path / "resumed", crashed_at=3)
    resumed = train_on(rl_config(tiny_model_dir, tmp_path / "resumed", *run), prompts, resume=True)
    # Step 3's rollout was sampled with step 1's weights while step 2 trained: the checkpoint kept it.
    assert (whole / "checkpoints").is_dir() and records(resumed, "rl/staleness") == {1: 0.0, 2: 1.0, 3: 1.0, 4: 1.0}
    assert train_losses(resumed) == pytest.approx(train_losses(whole), rel=1e-6, abs=1e-9)
    for step, values in figures(resumed).items():
        assert values == pytest.approx(figures(whole)[step], rel=1e-6, abs=1e-9), step
