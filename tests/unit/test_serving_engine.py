"""The continuous-batching engine of `rayft serve` in-process (no Ray): rows that join a running batch at
different steps, with different prompt lengths, adapters and sampling settings, decode token for token as
HF `generate` decodes each alone; rows leave on their own; a full queue refuses; a client gone frees its row."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rayft.config import ModelConfig
from rayft.generation.hf import HFBackend
from rayft.serving.engine import BASE_ADAPTER, Engine, EngineSettings, QueueFullError
from rayft.serving.mixed_step import MIXED_MODEL_TYPES
from rayft.serving.plan import Adapter, BaseGroup
from rayft.serving.protocol import Job, RequestError
from rayft.serving.rows import Event, Finished, Text

PROMPTS = ["The quick brown fox", "Question: A baker has 12 apples and buys 7 more. How many", "SELECT", "0 1 2 3"]


@dataclass(frozen=True)
class LogprobJob(Job):
    """A job that asks for log-probabilities (the fields the protocol's Job gains for them)."""

    logprobs: bool = True
    top_logprobs: int = 0


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.checkpoints import build_lora_checkpoint

    root = tmp_path_factory.mktemp("engine-adapters")
    return {name: build_lora_checkpoint(root / name, tiny_model_dir, seed=seed, scale=0.5) for name, seed in
            (("alpha", 1), ("beta", 2))}  # fmt: skip


def _engine(tiny_model_dir: Path, adapter_dirs: dict[str, Path], **settings: Any) -> Engine:
    adapters = tuple(Adapter(name, str(path)) for name, path in adapter_dirs.items())
    return Engine(BaseGroup("base", ModelConfig(name=str(tiny_model_dir)), adapters), EngineSettings(**settings))


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, adapter_dirs: dict[str, Path]) -> Engine:
    return _engine(tiny_model_dir, adapter_dirs)


def _job(prompt: str = PROMPTS[0], max_tokens: int | None = 6, stop: tuple[str, ...] = (), **kw: Any) -> Job:
    temperature, top_p, seed = kw.get("temperature", 0.0), kw.get("top_p", 1.0), kw.get("seed")
    return LogprobJob(prompt, max_tokens, temperature, top_p, stop, seed, top_logprobs=kw.get("top", 0))


def _reference(model_dir: Path, adapter: Path | None, prompt: str, max_tokens: int) -> list[int]:
    """The token ids HF `generate` decodes greedily for ``prompt`` alone (up to and without EOS)."""
    import torch

    backend = HFBackend(ModelConfig(name=str(model_dir)), adapter_path=str(adapter) if adapter else None, device="cpu")
    ids = backend.encode([prompt])[0]
    with torch.inference_mode():
        out = backend.model.generate(torch.tensor([ids]), attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
                                     max_new_tokens=max_tokens, do_sample=False, eos_token_id=sorted(backend.eos_ids()),
                                     pad_token_id=backend.tokenizer.pad_token_id)  # fmt: skip
    new = out[0, len(ids) :].tolist()
    return next((new[:i] for i, t in enumerate(new) if t in backend.eos_ids()), new)


async def _drain(stream: AsyncGenerator[Event, None], sink: list[Event], after: asyncio.Event | None = None) -> None:
    async for event in stream:
        sink.append(event)
        if after is not None and sum(not isinstance(e, Finished) for e in sink) >= 2:
            after.set()


def _ids(events: list[Event]) -> list[int]:
    return [lp.token_id for e in events if isinstance(e, Text) for lp in e.logprobs or ()]


def _text(events: list[Event]) -> str:
    return "".join(e.text if isinstance(e, Text) else e for e in events if not isinstance(e, Finished))


async def _staggered(engine: Engine, jobs: list[tuple[Job, str | None]]) -> list[list[Event]]:
    """Each request submitted once the one before it has streamed two pieces of text (so joins a running batch)."""
    sinks: list[list[Event]] = [[] for _ in jobs]
    tasks = []
    for index, (job, adapter) in enumerate(jobs):
        started = asyncio.Event()
        tasks.append(asyncio.create_task(_drain(engine.submit(engine.prepare(job, adapter)), sinks[index], started)))
        if index < len(jobs) - 1:
            await asyncio.wait([asyncio.create_task(started.wait()), tasks[-1]], return_when=asyncio.FIRST_COMPLETED)
    await asyncio.gather(*tasks)
    return sinks


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed-steps", "prefill-steps"])
def test_rows_joining_a_running_batch_decode_as_generate_alone(
    engine: Engine, tiny_model_dir: Path, adapter_dirs: dict[str, Path], mixed: bool
) -> None:
    engine = engine if mixed else _engine(tiny_model_dir, adapter_dirs, mixed_steps=False)
    lengths = [40, 24, 16, 8]
    before, mixed_before = engine.stats.joined_running_batch, engine.stats.mixed_steps
    events = asyncio.run(_staggered(engine, [(_job(p, n), None) for p, n in zip(PROMPTS, lengths, strict=True)]))
    for prompt, n, got in zip(PROMPTS, lengths, events, strict=True):
        expected = _reference(tiny_model_dir, None, prompt, n)
        assert _ids(got) == expected, prompt
        assert got[-1] == Finished("length" if len(expected) == n else "stop", len(expected) + (len(expected) < n))
    assert engine.stats.joined_running_batch - before == 3
    assert engine.stats.mixed_steps - mixed_before == (3 if mixed else 0)  # each join, in the running rows' step
    assert engine.stats.rows_in_flight == 0 and engine.stats.largest_batch >= 2


def _tokens(batch: Any, plan: list[list[Any]], steps: int) -> dict[int, list[tuple[int, float, list[int]]]]:
    """Each row's (token, log-probability, top-3 ids) over ``steps`` steps, rows joining at the planned steps."""
    got: dict[int, list[tuple[int, float, list[int]]]] = {}
    for index in range(steps):
        for key, picked in batch.step(plan[index] if index < len(plan) else []).items():
            got.setdefault(key, []).append((picked.token, picked.logprob, [t for t, _ in picked.top]))
    return got


@pytest.mark.numerics  # run under every CPU kernel path by scripts/test_kernels.py
def test_a_mixed_step_computes_what_a_prefill_step_and_a_decoding_step_compute(engine: Engine) -> None:
    """Rows of two adapters and the base, joining a running batch: the mixed forward (every new token in the
    batch dimension, attention by rayft's function) gives each row the tokens and log-probabilities that
    separate prefill and decoding steps give, and the joined rows' caches continue as theirs do."""
    from rayft.serving.batch import NewRow, RunningBatch, Sampler

    engine.load_adapter("alpha")
    engine.load_adapter("beta")
    names = [BASE_ADAPTER, engine._names["alpha"], engine._names["beta"], engine._names["alpha"]]
    prompts = [engine.prepare(_job(p), None).input_ids for p in PROMPTS]

    def row(key: int) -> NewRow:
        return NewRow(key, prompts[key], names[key], Sampler(0.0, 1.0, None), top_logprobs=3)

    plan = [[row(0)], [], [row(1), row(2)], [], [row(3)]]  # two rows join in one step, then one more
    runs = {}
    for mixed in (True, False):
        batch = RunningBatch(engine.backend.model, 0, "cpu", adapters=True, mixed=mixed)
        assert batch.mixes() is mixed
        runs[mixed] = _tokens(batch, plan, 14)
    for key in range(4):
        mixed_run, separate = runs[True][key], runs[False][key]
        n = min(len(mixed_run), len(separate))
        assert n >= 8
        assert [t for t, _, _ in mixed_run[:n]] == [t for t, _, _ in separate[:n]], key
        assert [top for _, _, top in mixed_run[:n]] == [top for _, _, top in separate[:n]], key
        # float32 both ways: a mixed step's products have other shapes than a prefill's and a decoding
        # step's, so other sums' orders: log-probabilities ~1e-6 apart (sqrt(64) * 2**-24 * |logit| per
        # layer); abs 1e-4 is far from that and far below a wrong cache position's error (~1).
        assert [lp for _, lp, _ in mixed_run[:n]] == pytest.approx([lp for _, lp, _ in separate[:n]], abs=1e-4)
    # The mixed batch decoded the running rows in the joining steps: it is ahead by one token per such step.
    assert len(runs[True][0]) == len(runs[False][0]) + 2


def test_mixed_steps_run_for_the_model_types_whose_attention_allows_them() -> None:
    from types import SimpleNamespace

    from rayft.serving.mixed_step import mixes

    def model(model_type: str, **config: Any) -> Any:
        return SimpleNamespace(config=SimpleNamespace(model_type=model_type, _attn_implementation="sdpa", **config))

    assert mixes(model("llama"))
    assert mixes(model("qwen2", sliding_window=4096, use_sliding_window=False))
    assert not mixes(model("qwen2", sliding_window=4096, use_sliding_window=True))
    assert not mixes(model("mistral", sliding_window=4096))
    assert mixes(model("mistral", sliding_window=None))
    assert not mixes(model("stablelm"))  # its attention does not pass the step on (the test below)
    assert mixes(model("qwen3", layer_types=["full_attention", "full_attention"]))
    assert not mixes(model("qwen3", layer_types=["full_attention", "sliding_attention"]))
    flex = model("llama")
    flex.config._attn_implementation = "flex_attention"
    assert not mixes(flex)


def _tiny_of_type(model_type: str) -> Any:
    """A tiny random model of ``model_type`` (two layers, sdpa), its sliding window off."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type, vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, pad_token_id=0,
        **({"rotary_dim": 8} if model_type == "gptj" else {}),
    )  # fmt: skip
    if getattr(config, "use_sliding_window", True) and getattr(config, "layer_types", None) is None:
        config.sliding_window = None  # Mistral's and Mixtral's default window of 4096: off, as a mixed step needs
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def _mixed_and_separate(model: Any) -> tuple[dict[int, list[tuple[int, float, list[int]]]], ...]:
    """Four rows joining at steps 0, 2 (two) and 4, decoded for 12 steps with mixed steps and without."""
    from rayft.serving.batch import NewRow, RunningBatch, Sampler

    prompts = [[5, 9, 17, 3, 8, 22, 1], [7, 7, 31, 2], [40, 41, 42, 43, 44, 45, 46, 47, 48], [11, 12]]

    def row(key: int) -> NewRow:
        return NewRow(key, prompts[key], BASE_ADAPTER, Sampler(0.0, 1.0, None), top_logprobs=3)

    plan = [[row(0)], [], [row(1), row(2)], [], [row(3)]]
    runs = []
    for mixed in (True, False):
        batch = RunningBatch(model, 0, "cpu", mixed=mixed)
        assert batch.mixes() is mixed
        runs.append(_tokens(batch, plan, 12))
    return runs[0], runs[1]


@pytest.mark.parametrize("model_type", sorted(MIXED_MODEL_TYPES))
def test_each_model_type_that_runs_mixed_steps_computes_in_them_what_separate_steps_compute(model_type: str) -> None:
    mixed, separate = _mixed_and_separate(_tiny_of_type(model_type))
    for key in range(4):
        n = min(len(mixed[key]), len(separate[key]))
        assert n >= 6, key
        assert [(t, top) for t, _, top in mixed[key][:n]] == [(t, top) for t, _, top in separate[key][:n]], key
        assert [lp for _, lp, _ in mixed[key][:n]] == pytest.approx([lp for _, lp, _ in separate[key][:n]], abs=1e-4)


def test_a_model_type_whose_attention_does_not_pass_the_step_on_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # StableLM's attention layers call the attention function without the forward's extra arguments: forced into
    # mixed steps, the step fails, which is why the type is not among those that run them.
    from rayft.serving import mixed_step

    monkeypatch.setattr(mixed_step, "MIXED_MODEL_TYPES", mixed_step.MIXED_MODEL_TYPES | {"stablelm"})
    with pytest.raises(TypeError, match="rayft_mixed"):
        _mixed_and_separate(_tiny_of_type("stablelm"))


def test_mixed_adapters_in_one_running_batch_decode_as_each_alone(
    engine: Engine, tiny_model_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    plan: list[tuple[str, str | None]] = [(PROMPTS[1], "alpha"), (PROMPTS[0], None), (PROMPTS[3], "beta"),
                                          (PROMPTS[2], "alpha")]  # fmt: skip
    events = asyncio.run(_staggered(engine, [(_job(p, 12), a) for p, a in plan]))
    for (prompt, adapter), got in zip(plan, events, strict=True):
        assert _ids(got) == _reference(tiny_model_dir, adapter_dirs[adapter] if adapter else None, prompt, 12)
    assert len({tuple(_ids(e)) for e in events[:3]}) == 3
    assert engine.stats.base_loads == 1 and engine.stats.adapter_loads == {"alpha": 1, "beta": 1}


def test_a_base_row_decodes_as_alone_through_the_step_that_loads_the_first_adapter(
    tiny_model_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    """An adapter's request joins a base request's running batch on a replica that has loaded no adapter yet: the
    step that loads it (wrapping the model in a PeftModel) still decodes the base row without the adapter."""
    engine = _engine(tiny_model_dir, adapter_dirs)
    events = asyncio.run(_staggered(engine, [(_job(PROMPTS[1], 12), None), (_job(PROMPTS[0], 12), "beta")]))
    assert engine.stats.joined_running_batch == 1 and engine.stats.adapter_loads == {"beta": 1}
    assert _ids(events[0]) == _reference(tiny_model_dir, None, PROMPTS[1], 12)
    assert _ids(events[1]) == _reference(tiny_model_dir, adapter_dirs["beta"], PROMPTS[0], 12)


def test_a_short_request_finishes_while_a_long_one_streams(engine: Engine) -> None:
    async def scenario() -> list[str]:
        order: list[str] = []

        async def run(name: str, job: Job) -> None:
            async for event in engine.submit(engine.prepare(job, None)):
                if isinstance(event, Finished):
                    order.append(f"{name} finished")
                elif name == "long" and "long streams" not in order:  # its first piece of text
                    order.append("long streams")

        long = asyncio.create_task(run("long", _job(PROMPTS[0], 300)))
        while "long streams" not in order:
            await asyncio.sleep(0.01)
        await run("short", _job(PROMPTS[2], 3))
        await long
        return order

    assert asyncio.run(scenario()) == ["long streams", "short finished", "long finished"]


def test_sampling_settings_are_per_row_within_one_batch(engine: Engine) -> None:
    sampled = _job(PROMPTS[1], 16, temperature=1.5, top_p=0.9, seed=7)

    async def together() -> list[list[Event]]:
        sinks: list[list[Event]] = [[], [], []]
        jobs = [sampled, _job(PROMPTS[1], 16), sampled]
        streams = [engine.submit(engine.prepare(job, None)) for job in jobs]
        await asyncio.gather(*(_drain(stream, sink) for stream, sink in zip(streams, sinks, strict=True)))
        return sinks

    alone: list[Event] = []
    asyncio.run(_drain(engine.submit(engine.prepare(sampled, None)), alone))
    mixed = asyncio.run(together())
    assert _ids(mixed[0]) == _ids(mixed[2]) == _ids(alone)  # a seeded row samples the same, whatever its batch
    assert _ids(mixed[0]) != _ids(mixed[1])


def test_stop_strings_end_their_row_and_logprobs_come_with_the_text(engine: Engine) -> None:
    full: list[Event] = []
    asyncio.run(_drain(engine.submit(engine.prepare(_job(PROMPTS[0], 12, top=3), "beta")), full))
    text = _text(full)
    stop = text[3:5]
    stopped: list[Event] = []
    asyncio.run(_drain(engine.submit(engine.prepare(_job(PROMPTS[0], 12, (stop,)), "beta")), stopped))
    assert _text(stopped) == text[: text.index(stop)]
    assert isinstance(stopped[-1], Finished) and stopped[-1].finish_reason == "stop"
    first = next(lp for e in full if isinstance(e, Text) for lp in e.logprobs or ())
    assert len(first.top) == 3 and first.top[0][1] >= first.logprob - 1e-6 and first.logprob <= 0
    assert first.top == sorted(first.top, key=lambda t: -t[1])
    plain: list[Event] = []  # a request that asks for no log-probabilities gets plain text
    asyncio.run(_drain(engine.submit(engine.prepare(Job(PROMPTS[0], 12, 0.0, 1.0, (), None), "beta")), plain))
    assert all(type(e) is str for e in plain[:-1]) and "".join(plain[:-1]) == text  # type: ignore[arg-type]


def test_a_closed_stream_frees_its_row_at_once(engine: Engine) -> None:
    async def scenario() -> tuple[int, int]:
        stream = engine.submit(engine.prepare(_job(PROMPTS[0], 500), None))
        await anext(stream)
        running, steps = engine.stats.rows_in_flight, engine.stats.steps
        await stream.aclose()  # what Serve does when the client goes away
        while engine.stats.rows_in_flight:
            await asyncio.sleep(0.01)
        return running, engine.stats.steps - steps

    before = engine.stats.cancelled
    running, steps_after_close = asyncio.run(scenario())
    assert running == 1 and engine.stats.cancelled == before + 1
    assert steps_after_close <= 2  # the step under way when it closed, at most: not its 500 tokens


def test_a_full_queue_refuses_with_a_retry_hint_and_the_kv_budget_serialises(
    engine: Engine, tiny_model_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    budget = engine.prepare(_job(PROMPTS[0], 100), None).need().kv_tokens + 1  # one request at a time
    small = _engine(tiny_model_dir, adapter_dirs, max_rows=4, kv_tokens=budget, max_queued=1)

    async def scenario() -> tuple[list[Event], list[Event], QueueFullError]:
        first: list[Event] = []
        second: list[Event] = []
        started = asyncio.Event()
        running = asyncio.create_task(_drain(small.submit(small.prepare(_job(PROMPTS[0], 100), None)), first, started))
        await started.wait()
        waiting = asyncio.create_task(_drain(small.submit(small.prepare(_job(PROMPTS[2], 4), None)), second))
        while not small.stats.waiting:
            await asyncio.sleep(0.01)
        with pytest.raises(QueueFullError) as refused:
            await anext(small.submit(small.prepare(_job(PROMPTS[3], 4), None)))
        await asyncio.gather(running, waiting)
        return first, second, refused.value

    first, second, refused = asyncio.run(scenario())
    assert refused.status == 429 and refused.retry_after_s >= 1 and "serve.max_queued_requests" in refused.message
    assert small.stats.refused == 1 and small.stats.largest_batch == 1
    assert isinstance(first[-1], Finished) and isinstance(second[-1], Finished)


def test_unloading_an_adapter_frees_it_and_a_request_reloads_it(engine: Engine) -> None:
    engine.load_adapter("alpha")
    before = engine.stats.adapter_loads["alpha"]
    engine.unload_adapter("alpha")
    assert engine.stats.adapter_unloads >= 1
    asyncio.run(_drain(engine.submit(engine.prepare(_job(max_tokens=2), "alpha")), []))
    assert engine.stats.adapter_loads["alpha"] == before + 1


def test_requests_after_the_last_adapter_is_unloaded_are_served(
    tiny_model_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    """PEFT keeps a deleted adapter's name active when no other is left: a base request and a request that
    loads the adapter again both run to their end on that model."""
    engine = _engine(tiny_model_dir, adapter_dirs)
    engine.load_adapter("alpha")
    engine.unload_adapter("alpha")
    for adapter in (None, "alpha"):
        events: list[Event] = []
        asyncio.run(asyncio.wait_for(_drain(engine.submit(engine.prepare(_job(max_tokens=2), adapter)), events), 60))
        assert isinstance(events[-1], Finished), (adapter, events[-1])


def test_a_prompt_or_max_tokens_past_the_context_or_kv_budget_is_refused(engine: Engine) -> None:
    with pytest.raises(RequestError, match="this model's context is 2048 tokens") as caught:
        engine.prepare(Job("fox " * 3000, None, 0.0, 1.0, (), None), None)
    assert caught.value.param == "prompt" and caught.value.code == "context_length_exceeded"
    with pytest.raises(RequestError, match="ask for at most") as too_many:
        engine.prepare(_job(max_tokens=5000), None)
    assert too_many.value.param == "max_tokens"
    assert engine.prepare(_job(max_tokens=None), None).max_tokens == EngineSettings().default_max_tokens
    small = EngineSettings(kv_tokens=64)
    engine.limits, saved = small.limits(), engine.limits
    try:
        with pytest.raises(RequestError, match=r"serve.kv_cache_tokens"):
            engine.prepare(_job(max_tokens=100), None)
    finally:
        engine.limits = saved


def test_decoding_steps_append_to_the_cache_in_place(engine: Engine) -> None:
    from rayft.serving.batch import SPARE_POSITIONS, NewRow, RunningBatch, Sampler

    batch = RunningBatch(engine.backend.model, 0, "cpu")
    prompts = [engine.prepare(_job(p), None).input_ids for p in PROMPTS[:2]]
    batch.step([NewRow(key, ids, BASE_ADAPTER, Sampler(0.0, 1.0, None)) for key, ids in enumerate(prompts)])
    batch.step([])  # the first decoding step moves the prefilled keys and values into a tensor with spare room
    storages = set()
    for _ in range(SPARE_POSITIONS - 1):
        batch.step([])
        storages.add(batch.cache.layers[0].keys.data_ptr())
    assert len(storages) == 1  # no copy of the whole cache at every step
    assert batch.width() == max(map(len, prompts)) + SPARE_POSITIONS


def test_a_loop_task_left_by_an_ended_event_loop_does_not_hold_a_new_request(engine: Engine) -> None:
    """An engine driven by one asyncio.run after another: a loop task of an earlier loop that never ran to its
    end steps no more, so the next request starts a loop of its own instead of waiting for ever."""
    old = asyncio.new_event_loop()
    engine._loop_task = old.create_future()  # type: ignore[assignment]  # pending in a loop that no longer runs
    try:
        events: list[Event] = []
        asyncio.run(asyncio.wait_for(_drain(engine.submit(engine.prepare(_job(max_tokens=2), None)), events), 60))
        assert isinstance(events[-1], Finished)
    finally:
        old.close()


def test_a_failure_of_the_loop_itself_reaches_the_request_instead_of_a_hang(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> list[object]:
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(engine, "_take_admitted", broken)
    with pytest.raises(RuntimeError, match="scheduler bug"):
        asyncio.run(asyncio.wait_for(_drain(engine.submit(engine.prepare(_job(max_tokens=2), None)), []), 60))
    assert not engine._waiting and not engine._running
