"""The batch engine of `rayft serve` in-process (no Ray): mixed adapters in one batch decode as each
alone does with `rayft generate`'s backend, rows stop on their own, a cancelled row stops early."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rayft.config import ModelConfig
from rayft.generation.backend import SamplingParams
from rayft.generation.hf import HFBackend
from rayft.serving.engine import Engine, EngineSettings, Event, Finished, Prepared
from rayft.serving.plan import Adapter, BaseGroup
from rayft.serving.protocol import Job, RequestError

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from rayft.testing.checkpoints import build_lora_checkpoint

    root = tmp_path_factory.mktemp("engine-adapters")
    return {name: build_lora_checkpoint(root / name, tiny_model_dir, seed=seed, scale=0.5) for name, seed in
            (("alpha", 1), ("beta", 2))}  # fmt: skip


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, adapter_dirs: dict[str, Path]) -> Engine:
    adapters = tuple(Adapter(name, str(path)) for name, path in adapter_dirs.items())
    return Engine(BaseGroup("base", ModelConfig(name=str(tiny_model_dir)), adapters), EngineSettings())


def _job(max_tokens: int | None = 6, stop: tuple[str, ...] = ()) -> Job:
    return Job(PROMPT, max_tokens, 0.0, 1.0, stop, None)


async def _collect(engine: Engine, requests: list[Prepared], cancel_after: int | None = None) -> list[list[Event]]:
    events: list[list[Event]] = [[] for _ in requests]
    steps = 0
    async for updates in engine.run_batch(requests):
        steps += 1
        for index, update in enumerate(updates):
            events[index].extend(update or ())
        if cancel_after is not None and steps == cancel_after:
            requests[0].cancelled = True
    return events


def _text(events: list[Event]) -> str:
    return "".join(e for e in events if isinstance(e, str))


def test_a_mixed_batch_decodes_each_row_as_its_adapter_alone(
    engine: Engine, tiny_model_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    for name in ("alpha", "beta"):
        engine.load_adapter(name)
    requests = [engine.prepare(_job(), adapter) for adapter in (None, "alpha", "beta", "alpha")]
    events = asyncio.run(_collect(engine, requests))
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    expected = [HFBackend(ModelConfig(name=str(tiny_model_dir)), device="cpu").generate([PROMPT], params)[0]]
    for name in ("alpha", "beta"):
        alone = HFBackend(ModelConfig(name=str(tiny_model_dir)), adapter_path=str(adapter_dirs[name]), device="cpu")
        expected.append(alone.generate([PROMPT], params)[0])
    expected.append(expected[1])
    assert [_text(e) for e in events] == [g.text for g in expected]
    assert [e[-1] for e in events] == [Finished(g.finish_reason, g.num_generated_tokens) for g in expected]
    assert len({_text(e) for e in events}) == 3
    assert engine.stats.base_loads == 1 and engine.stats.adapter_loads == {"alpha": 1, "beta": 1}


def test_rows_stop_on_their_own_and_a_cancelled_row_early(engine: Engine) -> None:
    full = _text(asyncio.run(_collect(engine, [engine.prepare(_job(12), "beta")]))[0])
    stop = full[3:5]
    requests = [engine.prepare(_job(40), "alpha"), engine.prepare(_job(12, (stop,)), "beta"),
                engine.prepare(_job(3), None)]  # fmt: skip
    events = asyncio.run(_collect(engine, requests, cancel_after=2))
    assert not any(isinstance(e, Finished) for e in events[0]) and engine.stats.cancelled == 1
    assert _text(events[1]) == full[: full.index(stop)] and events[1][-1].finish_reason == "stop"  # type: ignore[union-attr]
    assert events[2][-1] == Finished("length", 3)
    assert engine.stats.rows_in_flight == 0


def test_unloading_an_adapter_frees_it_and_a_request_reloads_it(engine: Engine) -> None:
    engine.load_adapter("alpha")
    before = engine.stats.adapter_loads["alpha"]
    engine.unload_adapter("alpha")
    assert engine.stats.adapter_unloads >= 1
    asyncio.run(_collect(engine, [engine.prepare(_job(2), "alpha")]))
    assert engine.stats.adapter_loads["alpha"] == before + 1


def test_a_prompt_or_max_tokens_past_the_context_is_refused(engine: Engine) -> None:
    with pytest.raises(RequestError, match="this model's context is 2048 tokens") as caught:
        engine.prepare(Job("fox " * 3000, None, 0.0, 1.0, (), None), None)
    assert caught.value.param == "prompt" and caught.value.code == "context_length_exceeded"
    with pytest.raises(RequestError, match="ask for at most") as too_many:
        engine.prepare(_job(5000), None)
    assert too_many.value.param == "max_tokens"
    assert engine.prepare(_job(None), None).max_tokens == EngineSettings().default_max_tokens
