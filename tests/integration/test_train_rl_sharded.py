"""GRPO under a sharded strategy on 2 Ray Train workers, on a tiny random model: each worker gathers the
whole weights once before it samples (colocated, or to send them to its generation actors), so a run under
FSDP or DeepSpeed ZeRO-3 samples the completions DDP samples and takes the same steps.

Tolerances: the gathered weights are the shards' values exactly, so the two runs' samples are the same
tokens; what differs is the order of float32 sums. FSDP and ZeRO-3 reduce-scatter the gradients and sum the
squares of their shards for the clipping norm where DDP all-reduces whole tensors: each reordered sum of n
terms moves a result by at most about n x eps32 (1.2e-7) of its magnitude. The largest reductions of a step are the
log-softmax over the 512-token vocabulary and the norm over the adapter's 4,096 parameters (rank 4 on every
linear layer of 2 blocks): n <= 2^12, so <= 5e-4 relative in the worst case and far less in practice (errors
of opposite sign cancel), carried into the weights by 3 steps of AdamW. So the losses agree to rel 1e-4 and
the adapters to that worst case of the 3 updates, each at most the learning rate (5e-4 x 3 x 5e-2 = 7.5e-5
absolute; measured: at most 2.2e-6, and 1.2e-5 for one element of 4,096 on a CPU with AVX2 only), against B
matrices moved by more than 1e-3 from zero; a strategy that dropped or doubled a worker's gradient would move
weights by about the learning rate, 600x that bound.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayft.data.prepared import PreparedData
from tests.integration.test_train_rl import BUILTIN_REWARDS, figures, prompts, rl_config
from tests.support.runs import adapter_tensors, train_losses, train_on

pytestmark = pytest.mark.integration
__all__ = ["prompts"]  # the prepared prompts, shared with the colocated tests

LEARNING_RATE = 5e-2
RUN = (BUILTIN_REWARDS, "train.max_steps=3", "train.save_steps=3", f"train.learning_rate={LEARNING_RATE}")
WEIGHTS_BOUND = 5e-4 * 3 * LEARNING_RATE  # the module docstring's worst case: 5e-4 relative of 3 updates of at most lr
ACTORS = ("train.rl.rollout.placement=actors", "train.rl.rollout.num_actors=2", "train.rl.rollout.num_cpus_per_actor=0",
          "train.rl.rollout.start_timeout_s=120", "train.rl.rollout.sync_timeout_s=120",
          "train.rl.rollout.generate_timeout_s=120")  # fmt: skip


@pytest.fixture(scope="module")
def ddp_run(tiny_model_dir: Path, prompts: PreparedData, tmp_path_factory: Any) -> Path:
    return train_on(rl_config(tiny_model_dir, tmp_path_factory.mktemp("ddp"), *RUN), prompts)


def assert_same_run(got_run: Path, want_run: Path) -> None:
    want, got = train_losses(want_run), train_losses(got_run)
    assert list(want) == [1, 2, 3] and want.keys() == got.keys()
    assert all(got[step] == pytest.approx(want[step], rel=1e-4, abs=1e-6) for step in want), (got, want)
    for step, values in figures(got_run).items():  # the same samples: the same rewards
        assert values == pytest.approx(figures(want_run)[step], rel=1e-4, abs=1e-6), step
    assert any(values["rl/reward_std"] > 0 for values in figures(want_run).values())  # the groups teach something
    want_weights, got_weights = adapter_tensors(want_run / "final"), adapter_tensors(got_run / "final")
    assert want_weights.keys() == got_weights.keys()
    assert all((got_weights[name] - tensor).abs().max() < WEIGHTS_BOUND for name, tensor in want_weights.items())
    # The adapter moved: LoRA's B matrices start at zero.
    assert any(tensor.abs().max() > 1e-3 for name, tensor in want_weights.items() if "lora_B" in name)


DEEPSPEED = ("train.strategy=deepspeed",)


@pytest.mark.parametrize(
    "overrides",
    [
        ("train.strategy=fsdp",),
        ("train.strategy=fsdp", *ACTORS),
        DEEPSPEED,
        # The weight sync reads the same gathered weights as colocated sampling: the slow tier runs it.
        pytest.param((*DEEPSPEED, *ACTORS), marks=pytest.mark.slow),
    ],
    ids=["fsdp-colocated", "fsdp-actors", "deepspeed-colocated", "deepspeed-actors"],
)
def test_grpo_under_a_sharded_strategy_equals_ddp(
    ddp_run: Path, tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path, overrides: tuple[str, ...]
) -> None:
    if overrides[: len(DEEPSPEED)] == DEEPSPEED:
        pytest.importorskip("deepspeed", reason="needs the deepspeed extra: pip install 'rayft[deepspeed]'")
    sharded = train_on(rl_config(tiny_model_dir, tmp_path, *RUN, *overrides), prompts)
    assert_same_run(sharded, ddp_run)
