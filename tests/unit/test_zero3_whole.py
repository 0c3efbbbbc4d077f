"""DeepSpeed ZeRO-3's parameters gathered whole for sampling (:func:`rayft.training.strategies.gathered.zero3_whole`),
through rayft's own ZeRO-3 strategy in a process group of one (gloo, in this process): inside, the forwards of
``generate`` find every parameter whole and release none (the engine's hooks are off); after, the parameters are
partitioned again, the hooks are back and training goes on. That two workers sample and train as DDP does is
tests/integration/test_train_rl_sharded.py's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.test_fsdp_whole import tiny_lora_model

# DeepSpeed 0.19 imports and calls what torch 2.13 deprecates; not ours to fix.
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings(r"ignore:`torch\.distributed\.[a-z_]+` is deprecated:FutureWarning"),
]


@pytest.fixture
def zero3_engine(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    pytest.importorskip("deepspeed", reason="needs the deepspeed extra: pip install 'rayft[deepspeed]'")
    import torch
    import torch.distributed as dist

    from rayft.training.modeling.precision import Precision
    from rayft.training.strategies.parallel import ParallelSetup
    from rayft.training.strategies.zero3 import DeepSpeedZero3

    for name, value in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}.items():  # what Ray Train's workers have
        monkeypatch.setenv(name, value)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    setup = ParallelSetup(
        device=torch.device("cpu"), world_size=1, precision=Precision(None, False), micro_batch_size=1,
        max_grad_norm=None,
        # The tiny model's parameters are all under ZeRO-3's persistence threshold, which would keep them whole.
        deepspeed={"zero_optimization": {"stage3_param_persistence_threshold": 0}},
    )  # fmt: skip
    engine, _ = DeepSpeedZero3().prepare(tiny_lora_model(0), lambda m: torch.optim.SGD(m.parameters(), lr=0.1), setup)
    yield engine
    engine.destroy()
    dist.destroy_process_group()


def hook_counts(engine: Any) -> tuple[int, int, int]:
    """The engine's module hooks: forward, backward, and the root's start-of-forward hook (0 or 1)."""
    offload = engine.optimizer.parameter_offload
    started = offload.fwd_pre_hook.id in offload.module._forward_pre_hooks
    return len(offload.forward_hooks), len(offload.backward_hooks), int(started)


def test_sampling_inside_the_gathered_parameters_releases_none_and_training_goes_on(zero3_engine: Any) -> None:
    import torch
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    from rayft.training.strategies.zero3 import DeepSpeedZero3

    engine, plain = zero3_engine, tiny_lora_model(0)
    hooks = hook_counts(engine)
    assert hooks[0] > 0 and hooks[2] == 1
    prompt = torch.tensor([[1, 2, 3, 4]])
    assert all(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in engine.parameters())
    with torch.no_grad():
        want = plain.generate(input_ids=prompt, do_sample=False, max_new_tokens=6, pad_token_id=0)
        with DeepSpeedZero3().whole_weights(engine):
            assert hook_counts(engine) == (0, 0, 0)
            got = engine.module.generate(input_ids=prompt, do_sample=False, max_new_tokens=6, pad_token_id=0)
            # Every decoding step ran with the parameters whole, and no hook released one to gather it again.
            assert all(p.ds_status == ZeroParamStatus.AVAILABLE for p in engine.parameters())
    assert got.equal(want)
    assert all(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in engine.parameters())  # partitioned again
    assert hook_counts(engine) == hooks
    with pytest.raises(RuntimeError, match="inside"), DeepSpeedZero3().whole_weights(engine):
        raise RuntimeError("inside")
    assert hook_counts(engine) == hooks  # put back also when the work inside raises
    for _ in range(2):  # training steps after sampling (the engine records its trace again): the same losses
        loss = engine(input_ids=prompt, labels=prompt).loss
        want_loss = plain(input_ids=prompt, labels=prompt).loss
        # One rank, float32: the same operations in the same order, so the losses are equal bitwise.
        assert loss.item() == want_loss.item()
        engine.backward(loss)
        engine.step()
        want_loss.backward()
        with torch.no_grad():
            for p in plain.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-0.1)  # torch's SGD step, as the engine's optimizer takes it
                    p.grad = None
