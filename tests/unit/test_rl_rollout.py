"""Rollouts on generation actors, planned without Ray or torch: which actors a worker owns and which samples
a micro-batch, the prompts read ahead for asynchronous rollouts, staleness, the timeout's line, and the
config's refusals of settings that cannot work."""

from __future__ import annotations

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError
from rayft.training.loop.batches import with_lookahead
from rayft.training.methods.rl.rollout_plan import actor_of, owned_actors, staleness, timeout_message


def test_each_worker_owns_its_share_of_the_actors_and_round_robins_its_micro_batches() -> None:
    assert [owned_actors(5, 2, rank) for rank in (0, 1)] == [[0, 2, 4], [1, 3]]
    assert owned_actors(1, 1, 0) == [0]
    assert [actor_of(index, 3) for index in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_lookahead_yields_every_item_once_with_the_next_ones() -> None:
    assert list(with_lookahead(iter([1, 2, 3]), 0)) == [(1, []), (2, []), (3, [])]
    assert list(with_lookahead(iter([1, 2, 3]), 1)) == [(1, [2]), (2, [3]), (3, [])]
    assert list(with_lookahead(iter([1, 2, 3]), 2)) == [(1, [2, 3]), (2, [3]), (3, [])]
    assert list(with_lookahead(iter([]), 1)) == []


def test_lookahead_reads_only_as_far_as_it_must() -> None:
    read: list[int] = []

    def items() -> object:
        for item in range(10):
            read.append(item)
            yield item

    first = next(with_lookahead(items(), 1))  # type: ignore[arg-type]
    assert first == (0, [1]) and read == [0, 1]  # prompts stream: never the whole set


def test_staleness_counts_the_steps_the_sampling_weights_lag_behind() -> None:
    assert staleness(step=1, version=0) == 0  # synchronous: the weights after step 0
    assert staleness(step=5, version=4) == 0
    assert staleness(step=5, version=3) == 1  # sampled while step 4 trained


def test_a_timeout_is_one_line_with_the_field_to_raise() -> None:
    line = timeout_message("the weight sync of step 3", 30.0, "sync_timeout_s", "an actor that hangs")
    assert "\n" not in line
    assert line == (
        "the weight sync of step 3 did not finish within 30 s (train.rl.rollout.sync_timeout_s); raise "
        "train.rl.rollout.sync_timeout_s if that is too short; likely cause: an actor that hangs"
    )


GRPO = ("train.objective=grpo", "data.packing=false")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.rl.rollout.max_staleness=1"], r"max_staleness=1 needs placement 'actors'.*set train\.rl\.rollout"),
        (["train.rl.rollout.engine=vllm"], r"engine=vllm is read by generation actors only"),
        (["train.rl.rollout.placement=actors", "train.rl.rollout.actor_class=mod.Class"], "not 'package.module:Class'"),
        (
            ["train.rl.rollout.placement=actors", "train.rl.rollout.num_actors=1"],
            "num_actors=1 is fewer than the 2 trai",
        ),
        (["train.rl.rollout.placement=actors", "train.rl.rollout.max_staleness=5"], r"max_staleness"),
        (["train.rl.steps_per_rollout=0"], r"steps_per_rollout"),
        (["train.rl.rollout.sync_timeout_s=0"], r"sync_timeout_s"),
    ],
)
def test_rollout_settings_that_cannot_work_are_refused_at_config_time(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*GRPO, *overrides])


def test_actor_settings_load_and_the_engine_follows_the_gpus() -> None:
    cfg = load_config(None, [*GRPO, "scaling.num_workers=2", "train.rl.rollout.placement=actors",
                             "train.rl.rollout.num_actors=2", "train.rl.rollout.max_staleness=1"])  # fmt: skip
    rollout = cfg.train.rl.rollout
    assert (rollout.placement, rollout.num_actors, rollout.max_staleness, rollout.resolved_engine) == (
        "actors", 2, 1, "hf")  # fmt: skip
    gpus = load_config(None, [*GRPO, "train.rl.rollout.placement=actors", "train.rl.rollout.num_gpus_per_actor=1"])
    assert gpus.train.rl.rollout.resolved_engine == "vllm"


def test_rollouts_sampled_ahead_round_trip_through_a_checkpoint() -> None:
    from rayft.config.rl import RolloutConfig
    from rayft.training.methods.rl.rollout_actors import ActorRollouts
    from rayft.training.methods.rl.sampling import Completions, PromptBatch

    config = RolloutConfig(placement="actors", max_staleness=1)
    saved = ActorRollouts([], config, "lora", group=2, seed=0)
    done = [Completions([[5, 2]], ["x"], 2, 0.5, version=3)]
    saved.ready, saved.prompts_of = {5: done}, {5: [40]}
    resumed = ActorRollouts([], config, "lora", group=2, seed=0)
    resumed.restore(saved.state() or "")
    batch = PromptBatch([[1, 2]], ["ref"], [40])
    assert resumed.sample(None, 5, [batch], []) == done  # no actor asked: the checkpoint's rollout
    assert not resumed.has(5)
