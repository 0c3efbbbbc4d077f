"""Generation inside one model replica: a base model, its LoRA adapters, and batches that stream.

An :class:`Engine` owns one :class:`~rayft.generation.hf.HFBackend` (the base model, loaded once)
and loads LoRA adapters into it by name. A batch of requests, each with its own adapter, is decoded
by one ``generate`` call (PEFT's per-row ``adapter_names``), one batch per distinct sampling
setting; every decoding step hands each request its new text, so a request streams while its
batch runs. Each row stops on its own (end of sequence, a stop string, its token limit, or its
client gone) and stops costing compute then. Ray Serve calls this from
:mod:`rayft.serving.replica`; nothing here imports Serve.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import warnings
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayft.generation.backend import SamplingParams, StopFilter
from rayft.generation.hf import HFBackend
from rayft.serving.plan import BaseGroup
from rayft.serving.protocol import Job, RequestError
from rayft.serving.scoring import Scored, score_tokens

log = logging.getLogger(__name__)

BASE_ADAPTER = "__base__"
"""PEFT's name for 'no adapter' in a batch that mixes adapters."""


@dataclass(frozen=True)
class EngineSettings:
    """What an engine needs from ``serve:``: the device and the default completion length."""

    device: str = "cpu"
    default_max_tokens: int = 256


@dataclass(frozen=True)
class Finished:
    """The end of one request's completion: why it ended and how many tokens it took."""

    finish_reason: str
    completion_tokens: int


@dataclass
class Prepared:
    """A request ready to join a batch: its token ids, its adapter and its limits."""

    job: Job
    adapter: str | None
    input_ids: list[int]
    max_tokens: int
    cancelled: bool = False

    def sampling_key(self) -> tuple[float, float, int | None]:
        """Requests with equal keys are decoded in one ``generate`` call."""
        return (self.job.temperature, self.job.top_p if self.job.temperature > 0 else 1.0, self.job.seed)


Event = str | Finished
"""What a request receives at a step: new text, then one :class:`Finished`."""


@dataclass
class EngineStats:
    """Counters of one replica, for tests and operators: loads, unloads, rows in flight."""

    base_loads: int = 0
    adapter_loads: dict[str, int] = field(default_factory=dict)
    adapter_unloads: int = 0
    batches: int = 0
    rows_in_flight: int = 0
    cancelled: int = 0
    largest_batch: int = 0


class Engine:
    """One base model and its adapters on one device; see the module docstring."""

    def __init__(self, group: BaseGroup, settings: EngineSettings) -> None:
        self.backend = HFBackend(group.model, device=settings.device, kv_cache="dynamic", compile=False)
        self.settings = settings
        self.adapters = {a.model_id: a for a in group.adapters}
        self._names = {a.model_id: f"adapter{i}" for i, a in enumerate(group.adapters)}  # PEFT names: no dots
        self._loaded: set[str] = set()
        self._lock = threading.Lock()  # adapter loads and unloads change the modules generate runs through
        self.stats = EngineStats(base_loads=1)

    def load_adapter(self, model_id: str) -> None:
        """Load the adapter served as ``model_id`` into the base model (idempotent)."""
        with self._lock:
            self._load(model_id)

    def unload_adapter(self, model_id: str) -> None:
        """Free the adapter's weights (the least recently used one, when Serve's cache is full)."""
        with self._lock:
            if model_id in self._loaded:
                with warnings.catch_warnings():
                    # PEFT warns that another adapter becomes the active one: every batch names its
                    # rows' adapters itself, so which one is active does not matter here.
                    warnings.filterwarnings("ignore", message="Adapter .* was active which is now deleted")
                    self.backend.model.delete_adapter(self._names[model_id])
                self._loaded.discard(model_id)
                self.stats.adapter_unloads += 1

    def _load(self, model_id: str) -> None:
        if model_id in self._loaded:
            return
        from peft import PeftModel

        path, name = self.adapters[model_id].path, self._names[model_id]
        if isinstance(self.backend.model, PeftModel):
            self.backend.model.load_adapter(path, adapter_name=name)
        else:
            self.backend.model = PeftModel.from_pretrained(self.backend.model, path, adapter_name=name).eval()
        self._loaded.add(model_id)
        self.stats.adapter_loads[model_id] = self.stats.adapter_loads.get(model_id, 0) + 1
        log.info("loaded adapter %s from %s", model_id, path)

    def prepare(self, job: Job, adapter: str | None) -> Prepared:
        """Render and tokenize a request; a :class:`RequestError` (400) when it cannot fit the context."""
        ids = self.prompt_ids(job, adapter)
        context = self.backend.context_tokens()
        if context is not None and len(ids) >= context:
            raise RequestError(
                400,
                f"the prompt has {len(ids)} tokens; this model's context is {context} tokens, with room for the "
                "completion; shorten the prompt",
                "messages" if isinstance(job.prompt, list) else "prompt",
                "context_length_exceeded",
            )
        room = context - len(ids) if context is not None else None
        if job.max_tokens is not None and room is not None and job.max_tokens > room:
            raise RequestError(
                400,
                f"max_tokens is {job.max_tokens}, but the prompt takes {len(ids)} of the model's {context} context "
                f"tokens; ask for at most {room}",
                "max_tokens",
                "context_length_exceeded",
            )
        limit = job.max_tokens or min(self.settings.default_max_tokens, room or self.settings.default_max_tokens)
        return Prepared(job, adapter, ids, limit)

    def prompt_ids(self, job: Job, adapter: str | None) -> list[int]:
        """The prompt's token ids: given ones as they are (each checked against the vocabulary), else
        the rendered prompt's."""
        if job.prompt_ids is None:
            return self.backend.encode([self.render(job, adapter)])[0]
        vocabulary = len(self.backend.tokenizer)
        if bad := [i for i in job.prompt_ids if i >= vocabulary]:
            raise RequestError(
                400, f"the prompt has {len(bad)} token ids outside this model's vocabulary of {vocabulary} tokens, "
                f"first {bad[0]}; send ids below {vocabulary}, or the prompt as text", "prompt",
            )  # fmt: skip
        return list(job.prompt_ids)

    def score(self, job: Job, adapter: str | None) -> Scored:
        """The prompt's token log-probabilities and a greedy continuation of ``job.max_tokens``
        (``echo`` requests), by forward passes outside the decoding batches."""
        ids = self.prepare(job, adapter).input_ids
        tokenizer = self.backend.tokenizer
        with self._lock:  # the same lock as a batch's generate: adapters stay put, PEFT's hooks are ours
            if adapter:
                self._load(adapter)
            extra = {"adapter_names": [self._names[adapter] if adapter else BASE_ADAPTER]} if self._loaded else {}
            return score_tokens(
                self.backend.model, ids, decode=lambda t: str(tokenizer.decode(t)), top_n=job.top_logprobs,
                new_tokens=self._echo_tokens(job), eos=frozenset(self.backend.eos_ids()), forward_kwargs=extra,
            )  # fmt: skip

    def _echo_tokens(self, job: Job) -> int:
        return job.max_tokens if job.max_tokens is not None else self.settings.default_max_tokens

    def render(self, job: Job, adapter: str | None) -> str:
        """The text fed to the model: an adapter's chat template when it was trained with its own."""
        template = self.adapters[adapter].chat_template if adapter else None
        if template is None or isinstance(job.prompt, str):
            return self.backend.render(job.prompt)
        tokenizer = self.backend.tokenizer
        return str(tokenizer.apply_chat_template(job.prompt, tokenize=False, add_generation_prompt=True,
                                                 chat_template=template))  # fmt: skip

    async def run_batch(self, requests: Sequence[Prepared]) -> AsyncIterator[list[list[Event] | None]]:
        """Decode a batch, yielding one entry per request at each step (None: nothing new, or done).

        Requests with different sampling settings are decoded one group after the other.
        """
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(requests))
        groups: dict[tuple[float, float, int | None], list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(request.sampling_key(), []).append(index)
        for indices in groups.values():
            async for updates in self._run_group([requests[i] for i in indices]):
                out: list[list[Event] | None] = [None] * len(requests)
                for index, events in zip(indices, updates, strict=True):
                    out[index] = events
                yield out

    async def _run_group(self, rows: list[Prepared]) -> AsyncIterator[list[list[Event] | None]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        states = [_RowState(self.backend, row) for row in rows]
        self.stats.rows_in_flight += len(rows)
        thread = threading.Thread(target=self._generate, args=(rows, states, loop, queue), daemon=True)
        thread.start()
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                updates = [state.step(token) for state, token in zip(states, item, strict=True)]
                yield [events or None for events in updates]
            yield [state.finish("length") if not state.done else None for state in states]
        finally:
            for state in states:
                state.done = True  # stops the generation thread, should this generator be closed early
            self.stats.rows_in_flight -= len(rows)
            self.stats.cancelled += sum(row.cancelled for row in rows)

    def _generate(self, rows: list[Prepared], states: list[_RowState], loop: Any, queue: asyncio.Queue[Any]) -> None:
        """The ``generate`` call of one group, on its own thread; each step's tokens go to ``queue``."""
        try:
            with self._lock:
                for adapter in {row.adapter for row in rows if row.adapter}:
                    self._load(adapter)  # again, if Serve's cache dropped it while the request waited
                kwargs = self._generate_args(rows, states, loop, queue)
                import torch

                seed = rows[0].job.seed
                if seed is not None:
                    torch.manual_seed(seed)
                with torch.inference_mode():
                    self.backend.model.generate(**kwargs)
        except BaseException as exc:  # handed to the event loop, which raises it to every request
            loop.call_soon_threadsafe(queue.put_nowait, exc)
        loop.call_soon_threadsafe(queue.put_nowait, _END)

    def _generate_args(self, rows: list[Prepared], states: list[_RowState], loop: Any, queue: Any) -> dict[str, Any]:
        from transformers import StoppingCriteriaList

        tokenizer = self.backend.tokenizer
        padded = tokenizer.pad({"input_ids": [row.input_ids for row in rows]}, return_tensors="pt")
        job = rows[0].job
        params = SamplingParams(max(row.max_tokens for row in rows), job.temperature, job.top_p, (), job.seed)
        kwargs: dict[str, Any] = {k: v.to(self.backend.model.device) for k, v in padded.items()}
        kwargs.update(self.backend.generate_kwargs(params))
        kwargs.update(streamer=_QueueStreamer(loop, queue), stopping_criteria=StoppingCriteriaList([_RowStop(states)]))
        if self._loaded:  # a PEFT model: each row names its adapter
            kwargs["adapter_names"] = [self._names[row.adapter] if row.adapter else BASE_ADAPTER for row in rows]
        return kwargs


_END = object()


class _QueueStreamer:
    """A transformers streamer that hands each step's token ids (one per row) to the event loop."""

    def __init__(self, loop: Any, queue: asyncio.Queue[Any]) -> None:
        self.loop, self.queue, self.prompt_seen = loop, queue, False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:  # generate puts the prompt ids first
            self.prompt_seen = True
            return
        self.loop.call_soon_threadsafe(self.queue.put_nowait, value.reshape(-1).tolist())

    def end(self) -> None:
        """Nothing to do: the generation thread signals the end itself, after any error."""


class _RowStop:
    """Stopping criteria that end each row on its own: finished, or its request cancelled."""

    def __init__(self, states: list[_RowState]) -> None:
        self.states = states

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        done = [state.done or state.row.cancelled or state.count >= state.row.max_tokens for state in self.states]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class _RowState:
    """One row's decoding: its tokens so far, the text shown, and whether it has finished."""

    def __init__(self, backend: HFBackend, row: Prepared) -> None:
        self.tokenizer, self.eos = backend.tokenizer, backend.eos_ids()
        self.row, self.ids, self.count, self.shown, self.text = row, list[int](), 0, 0, ""
        self.filter = StopFilter(row.job.stop)
        self.done = False

    def step(self, token: int) -> list[Event]:
        """The events of one new token: text that is safe to show, and the end when it came."""
        if self.done or self.row.cancelled:
            self.done = True  # a cancelled row's client is gone: nothing more to decode or send
            return []
        self.count += 1
        if token in self.eos:
            return self.finish("stop")
        self.ids.append(token)
        self.text = str(self.tokenizer.decode(self.ids, skip_special_tokens=True))
        # A character whose bytes span tokens decodes as U+FFFD until its last token: wait for it.
        events = [] if self.text.endswith("\ufffd") else self._show()
        if self.filter.stopped:
            return [*events, *self.finish("stop")]
        if self.count >= self.row.max_tokens:
            return [*events, *self.finish("length")]
        return events

    def _show(self) -> list[Event]:
        piece = self.filter.feed(self.text[self.shown :])
        self.shown = len(self.text)
        return [piece] if piece else []

    def finish(self, reason: str) -> list[Event]:
        """The text held back and the end, once; the text is what decoding the whole row gives."""
        if self.done:
            return []
        self.done = True
        events = self._show()
        tail = self.filter.flush()
        return [*events, *([tail] if tail else []), Finished(reason, self.count)]
