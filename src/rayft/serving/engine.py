"""Generation inside one model replica: a base model, its LoRA adapters, and continuous batching.

An :class:`Engine` owns one :class:`~rayft.generation.hf.HFBackend` (the base model, loaded once)
and loads LoRA adapters into it by name. Requests join and leave one running batch between
decoding steps (:mod:`rayft.serving.batch`): a loop per replica (an asyncio task, whose steps run
on a worker thread) admits waiting requests while the batch has rows and KV budget left
(:mod:`rayft.serving.scheduler`), prefills them in the running rows' next decoding step (a mixed
step, one forward; or, for models that cannot mix, in a step of their own between decoding steps,
never two in a row while rows decode), and hands every row its new text at each step. A row that
ends (end of sequence, a stop string, its token limit) or whose client is gone leaves the batch
before the next step (a row's text and end: :mod:`rayft.serving.rows`; the replica's counters:
:mod:`rayft.serving.engine_stats`).
Rows with different adapters (PEFT's per-row ``adapter_names``) and different sampling settings
decode in one batch. With ``serve.prefix_cache_tokens``, a request whose prompt starts like an earlier one's
(same adapter) prefills only the rest (:mod:`rayft.serving.prefix_cache`); the scheduler counts only that rest
against the step's prefill budget. The waiting queue is bounded: a request beyond it is refused with 429 and a
retry hint.

Why not transformers' own continuous batching (``generate_batch`` / ``init_continuous_batching``,
transformers 5.24): it runs on CPU, but packs every request into one sequence (batch dimension 1),
so PEFT's per-row ``adapter_names`` cannot select an adapter per request; it seeds once per
manager, not per request; and on this project's 2-core CPU machine its ``generate_batch`` took 57 s
for two 8-token greedy completions of a tiny test model that ``generate`` decodes in well under a
second. Ray Serve calls this from :mod:`rayft.serving.replica`; nothing here imports Serve.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rayft.config.serve import ServeConfig
from rayft.generation.hf import HFBackend
from rayft.serving.engine_stats import EngineStats
from rayft.serving.plan import Adapter, BaseGroup
from rayft.serving.prefix_cache import PrefixCache, block_digests
from rayft.serving.protocol import Job, RequestError
from rayft.serving.rows import Event, Finished, RowState
from rayft.serving.scheduler import Limits, Need, plan_admission, prefill_turn, queue_full, retry_after_s
from rayft.serving.scoring import Scored, score_tokens
from rayft.serving.tools import tool_messages

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from rayft.serving.batch import NewRow, RunningBatch
    from rayft.serving.grammar import GrammarCompiler
    from rayft.serving.sampling import Constraint

log = logging.getLogger(__name__)

BASE_ADAPTER = "__base__"
"""PEFT's name for 'no adapter' in a batch that mixes adapters."""


@dataclass(frozen=True)
class EngineSettings:
    """What an engine needs from ``serve:``: the device, the default completion length and the batch's bounds."""

    device: str = "cpu"
    default_max_tokens: int = 256
    max_rows: int = 16
    kv_tokens: int = 32768
    max_queued: int = 48
    max_prefill_tokens: int = 64
    mixed_steps: bool = True
    prefix_cache_tokens: int = 0

    @classmethod
    def of(cls, cfg: ServeConfig) -> EngineSettings:
        """The settings of ``serve:`` (a replica with GPUs runs on CUDA)."""
        return cls(
            device="cuda" if cfg.num_gpus_per_replica > 0 else "cpu",
            default_max_tokens=cfg.max_tokens,
            max_rows=cfg.max_batch_size,
            kv_tokens=cfg.kv_cache_tokens,
            max_queued=cfg.max_queued_requests,
            max_prefill_tokens=cfg.max_prefill_tokens,
            mixed_steps=cfg.mixed_steps,
            prefix_cache_tokens=cfg.prefix_cache_tokens,
        )

    def limits(self) -> Limits:
        """The scheduler's bounds."""
        return Limits(self.max_rows, self.kv_tokens, self.max_queued, self.max_prefill_tokens)


@dataclass
class Prepared:
    """A request ready to join the batch: its token ids, its adapter and its limits."""

    job: Job
    adapter: str | None
    input_ids: list[int]
    max_tokens: int
    cancelled: bool = False
    constraint: Constraint | None = None  # the grammar the output must match (structured output, forced calls)
    blocks: list[bytes] = field(default_factory=list)  # its prompt's block digests, where prefixes are cached
    cached: int = 0  # prompt tokens a cached prefix spares its prefill (known when it joins)

    def need(self, cached: int = 0) -> Need:
        """What the request takes of the batch (``cached``: prompt tokens a cached prefix would spare)."""
        return Need(len(self.input_ids), self.max_tokens, cached)


class QueueFullError(RequestError):
    """429: the replica's waiting queue is full; ``retry_after_s`` says when to try again."""

    def __init__(self, waiting: int, retry_after_s: int) -> None:
        super().__init__(
            429,
            f"the model replica has {waiting} requests waiting, as many as serve.max_queued_requests allows; "
            f"retry after {retry_after_s} s, or add replicas",
            None,
            "rate_limit_exceeded",
        )
        self.retry_after_s = retry_after_s


@dataclass
class _Request:
    """One request in the engine: its row's decoding state and the queue its events go to."""

    key: int
    prepared: Prepared
    state: RowState
    events: asyncio.Queue[Any]
    submitted: float = field(default_factory=time.perf_counter)


class Engine:
    """One base model and its adapters on one device; see the module docstring."""

    def __init__(self, group: BaseGroup, settings: EngineSettings) -> None:
        self.backend = HFBackend(group.model, device=settings.device, kv_cache="dynamic", compile=False)
        if self.backend.encoder_decoder:
            raise ValueError(
                f"{group.model.name} is an encoder-decoder model; rayft serve's hf backend batches decoder-only "
                "models; serve a causal language model"
            )
        self.settings, self.limits = settings, settings.limits()
        self.adapters = {a.model_id: a for a in group.adapters}
        self._names = {a.model_id: f"adapter{i}" for i, a in enumerate(group.adapters)}  # PEFT names: no dots
        self._loaded: set[str] = set()
        self._lock = threading.Lock()  # adapter loads and unloads change the modules a step runs through
        self.stats = EngineStats(base_loads=1)
        self._waiting: collections.deque[_Request] = collections.deque()
        self._running: dict[int, _Request] = {}
        self._keys = 0
        self._loop_task: asyncio.Task[None] | None = None
        self._step_s = 0.0  # recent time of one step, for the retry hint of a refusal
        self._batch: RunningBatch | None = None
        self._prefilled_last_step = False
        self._grammar_compiler: GrammarCompiler | None = None
        self._prefixes = PrefixCache(settings.prefix_cache_tokens)

    def load_adapter(self, model_id: str) -> None:
        """Load the adapter served as ``model_id`` into the base model (idempotent)."""
        with self._lock:
            self._load(model_id)

    def unload_adapter(self, model_id: str) -> None:
        """Free the adapter's weights (the least recently used one, when Serve's cache is full)."""
        with self._lock:
            self._unload(model_id)

    def _unload(self, model_id: str) -> None:
        if model_id in self._loaded:
            self._drop_partial(self._names[model_id])
            self._loaded.discard(model_id)
            self.stats.adapter_unloads += 1

    def _drop_partial(self, name: str) -> None:
        """Delete PEFT adapter ``name`` from the model, if it is there (a load that failed half-way too)."""
        configs = getattr(self.backend.model, "peft_config", {})
        if name not in configs:
            return
        if len(configs) == 1:
            # A PEFT model whose last adapter is deleted cannot run (its forward reads the active adapter's
            # config): the base model comes back without LoRA layers, and the next load wraps it again.
            self.backend.model = self.backend.model.unload()
            return
        with warnings.catch_warnings():
            # PEFT warns that another adapter becomes the active one: every batch names its
            # rows' adapters itself, so which one is active does not matter here.
            warnings.filterwarnings("ignore", message="Adapter .* was active which is now deleted")
            self.backend.model.delete_adapter(name)

    def register(self, model_id: str, source: str) -> None:
        """Serve the adapter at ``source`` (a directory or URI) as ``model_id`` from now on (loaded at run time);
        one registered before under that id from elsewhere is unloaded first."""
        with self._lock:
            known = self.adapters.get(model_id)
            if known is not None and known.path == source:
                return
            self._unload(model_id)
            self._prefixes.forget(self._prefix_key(model_id))
            self.adapters[model_id] = Adapter(model_id, source)
            self._names.setdefault(model_id, f"adapter{len(self._names)}")

    def forget(self, model_id: str) -> None:
        """Unload an adapter loaded at run time and stop serving it."""
        with self._lock:
            self._unload(model_id)
            self._prefixes.forget(self._prefix_key(model_id))
            self.adapters.pop(model_id, None)

    def _load(self, model_id: str) -> None:
        if model_id in self._loaded:
            return
        from peft import PeftModel

        from rayft.security import mask_uri
        from rayft.serving.adapters import adapter_files, check_fits, load_failure

        source, name = self.adapters[model_id].path, self._names[model_id]
        path = adapter_files(source)
        check_fits(self.backend.model, path, model_id, mask_uri(source))
        try:
            if isinstance(self.backend.model, PeftModel):
                self.backend.model.load_adapter(str(path), adapter_name=name)
            else:
                self.backend.model = PeftModel.from_pretrained(self.backend.model, path, adapter_name=name).eval()
        except (RuntimeError, ValueError, KeyError, OSError) as exc:  # shapes or modules that do not match
            self._drop_partial(name)
            raise load_failure(model_id, mask_uri(source), self.backend.name, exc) from None
        self._loaded.add(model_id)
        self.stats.adapter_loads[model_id] = self.stats.adapter_loads.get(model_id, 0) + 1
        log.info("loaded adapter %s from %s", model_id, mask_uri(source))

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
        self._check_kv(len(ids), limit)
        guide = job.tools.guide
        blocks = block_digests(ids) if self._prefixes.budget_blocks else []
        return Prepared(job, adapter, ids, limit, constraint=self._grammars().matcher(guide) if guide else None,
                        blocks=blocks)  # fmt: skip

    def _check_kv(self, prompt: int, limit: int) -> None:
        if prompt + limit > self.limits.kv_tokens:
            raise RequestError(
                400,
                f"the prompt ({prompt} tokens) and max_tokens ({limit}) need {prompt + limit} KV cache tokens; "
                f"a replica holds {self.limits.kv_tokens} (serve.kv_cache_tokens); shorten the prompt or lower "
                "max_tokens",
                "max_tokens",
                "context_length_exceeded",
            )

    def _grammars(self) -> GrammarCompiler:
        """The replica's grammar compiler (its tokenizer's vocabulary read on the first constrained request)."""
        if self._grammar_compiler is None:
            from rayft.serving.grammar import GrammarCompiler

            self._grammar_compiler = GrammarCompiler(self.backend.tokenizer, set(self.backend.eos_ids()))
        return self._grammar_compiler

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
        """The text fed to the model: an adapter's chat template when it was trained with its own; tools and
        tool calls by the template where it renders them, else in the default format (:mod:`.tools`)."""
        template = self.adapters[adapter].chat_template if adapter else None
        if isinstance(job.prompt, str):
            return job.prompt
        messages, extra = tool_messages(job.prompt, job.tools.tools, template or self.backend.tokenizer.chat_template)
        if template is None and not extra:
            return self.backend.render(messages)
        return str(self.backend.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                              chat_template=template, **extra))  # fmt: skip

    def load(self) -> dict[str, Any]:
        """What the replica holds now, for the metrics: requests waiting and running per adapter (``""``: the
        base), the KV cache tokens the running requests reserve and the budget, the adapters loaded."""
        waiting, running = collections.Counter[str](), collections.Counter[str]()
        for request in list(self._waiting):
            waiting[request.prepared.adapter or ""] += 1
        running_now = list(self._running.values())
        for request in running_now:
            running[request.prepared.adapter or ""] += 1
        reserved = sum(r.prepared.need().kv_tokens for r in running_now)
        return {"waiting": dict(waiting), "running": dict(running), "kv_reserved": reserved,
                "kv_capacity": self.limits.kv_tokens, "adapters_loaded": len(self._loaded),
                "prefix_cache_hit_rate": self._prefixes.stats.hit_rate(),
                "prefix_cache_tokens": self._prefixes.stats.cached_tokens}  # fmt: skip

    def admit(self) -> None:
        """Refuse a new request now (:class:`QueueFullError`) when the waiting queue is full."""
        if queue_full(len(self._waiting), self.limits):
            self.stats.refused += 1
            remaining = [r.prepared.max_tokens - r.state.count for r in self._running.values()]
            raise QueueFullError(len(self._waiting), retry_after_s(remaining, self._step_s))

    async def submit(self, prepared: Prepared) -> AsyncGenerator[Event, None]:
        """Queue a request and stream its events; closing the stream (a client gone) frees its row.

        Raises:
            QueueFullError: the waiting queue is full (check with :meth:`admit` before anything is sent).
        """
        self.admit()
        self._keys += 1
        request = _Request(self._keys, prepared, RowState(self.backend, prepared), asyncio.Queue())
        self._waiting.append(request)
        self.stats.waiting = len(self._waiting)
        loop = asyncio.get_running_loop()
        # A loop task of another event loop (one that ended: an engine driven by several asyncio.run calls)
        # never steps again; the request would wait for ever.
        if self._loop_task is None or self._loop_task.done() or self._loop_task.get_loop() is not loop:
            self._loop_task = loop.create_task(self._run())
        finished = False
        try:
            while True:
                event = await request.events.get()
                if isinstance(event, BaseException):
                    raise event
                finished = isinstance(event, Finished)
                yield event
                if finished:
                    return
        finally:
            if not finished:
                prepared.cancelled = True  # the loop drops its row before the next step
                if request in self._waiting:
                    self._waiting.remove(request)
                    self.stats.waiting = len(self._waiting)
                    self.stats.cancelled += 1

    async def _run(self) -> None:
        """The replica's decoding loop: one step at a time while requests run or wait. Should the loop itself
        fail, every request it holds gets the error rather than waiting for ever."""
        try:
            await self._steps()
        except Exception as exc:  # not a cancellation: that ends the event loop, and its requests with it
            log.error("the decoding loop failed: %s: %s", type(exc).__name__, exc)
            for request in [*self._running.values(), *self._waiting]:
                with contextlib.suppress(RuntimeError):  # a queue of an event loop that has ended
                    request.events.put_nowait(exc)
            self._running.clear()
            self._waiting.clear()
            self._batch = None
            raise

    async def _steps(self) -> None:
        while self._waiting or self._running:
            admitted = self._take_admitted()
            started = time.perf_counter()
            try:
                results = await asyncio.to_thread(self._step, admitted)
            except Exception as exc:  # the batch is lost: every request in it gets the error
                log.error("a decoding step failed: %s: %s", type(exc).__name__, exc)
                for request in [*self._running.values(), *admitted]:
                    request.events.put_nowait(exc)
                self._running.clear()
                self._batch = None
                self.stats.rows_in_flight = 0
                continue
            elapsed = time.perf_counter() - started
            self._step_s = 0.8 * self._step_s + 0.2 * elapsed if self._step_s else elapsed
            prefilled = [len(r.prepared.input_ids) - r.prepared.cached for r in admitted]
            self.stats.count_step(prefilled, [r.submitted for r in admitted], len(results), started, elapsed)
            for request, events in results:
                for event in events:
                    request.events.put_nowait(event)

    def _take_admitted(self) -> list[_Request]:
        """The waiting requests that join at this step (the scheduler's plan), now counted as running."""
        while self._waiting and self._waiting[0].prepared.cancelled:
            self._waiting.popleft()
        running = [r.prepared.need() for r in self._running.values()]
        count = 0
        if prefill_turn(self._prefilled_last_step, len(self._running), mixed=self._running_batch().mixes()):
            count = plan_admission([self._need(r.prepared) for r in self._waiting], running, self.limits)
        admitted = [self._waiting.popleft() for _ in range(count)]
        self._prefilled_last_step = bool(admitted)
        if admitted and self._running:
            self.stats.joined_running_batch += len(admitted)
        for request in admitted:
            self._running[request.key] = request
        self.stats.waiting = len(self._waiting)
        self.stats.rows_in_flight = len(self._running)
        self.stats.largest_batch = max(self.stats.largest_batch, len(self._running))
        return admitted

    def _need(self, prepared: Prepared) -> Need:
        """What a waiting request takes of the batch, its prefill shortened by the prefix cached now."""
        if not prepared.blocks:
            return prepared.need()
        key, length = self._prefix_key(prepared.adapter), len(prepared.input_ids)
        return prepared.need(self._prefixes.cached_tokens(key, prepared.blocks, length))

    def _prefix_key(self, adapter: str | None) -> str:
        """Whose keys and values a cached prefix holds: the base's (``""``), or an adapter's id and source."""
        if adapter is None:
            return ""
        known = self.adapters.get(adapter)
        return f"{adapter}\n{known.path if known is not None else '(gone)'}"

    def _step(self, admitted: list[_Request]) -> list[tuple[_Request, list[Event]]]:
        """One decoding step on the worker thread: drop rows whose client left, decode, hand out the text."""
        with self._lock:
            batch = self._running_batch()
            gone = {key for key, r in self._running.items() if r.prepared.cancelled}
            if gone:
                batch.drop(gone)
                for key in gone:
                    del self._running[key]
                self.stats.cancelled += len(gone)
            for adapter in {r.prepared.adapter for r in self._running.values() if r.prepared.adapter}:
                self._load(adapter)  # again, if Serve's cache dropped it while the request waited or ran
            # The first adapter's load wraps the model in a PeftModel, whose forward alone picks each row's adapter:
            # the step runs through it (the unwrapped model would apply the active adapter to every row).
            batch.model, batch.adapters = self.backend.model, bool(self._loaded)
            joining = [self._new_row(r) for r in admitted if not r.prepared.cancelled]
            picked = batch.step(joining) if len(batch) or joining else {}
            self._keep_prefixes(admitted, batch.prefilled)
            self.stats.steps += 1
            results = [(r, r.state.take(picked[key])) for key, r in self._running.items() if key in picked]
            done = {r.key for r, _ in results if r.state.done}
            self.stats.cancelled += sum(self._running[key].prepared.cancelled for key in done)  # gone mid-step
            batch.drop(done)
            for key in done:
                del self._running[key]
            self.stats.rows_in_flight = len(self._running)
        return results

    def _running_batch(self) -> RunningBatch:
        if self._batch is None:
            from rayft.serving.batch import RunningBatch

            pad = self.backend.tokenizer.pad_token_id
            pad = pad if pad is not None else next(iter(self.backend.eos_ids()), 0)
            self._batch = RunningBatch(self.backend.model, int(pad), self.settings.device,
                                       mixed=self.settings.mixed_steps)  # fmt: skip
        self._batch.model = self.backend.model  # a PeftModel once the first adapter is loaded
        return self._batch

    def _new_row(self, request: _Request) -> NewRow:
        from rayft.serving.batch import NewRow
        from rayft.serving.sampling import Penalties, Sampler

        prepared = request.prepared
        job, adapter = prepared.job, prepared.adapter
        penalties = Penalties(job.presence_penalty, job.frequency_penalty, job.repetition_penalty)
        sampler = Sampler(job.temperature, job.top_p, job.seed, top_k=job.top_k, min_p=job.min_p, penalties=penalties,
                          prompt_ids=prepared.input_ids, constraint=prepared.constraint)  # fmt: skip
        top = int(getattr(job, "top_logprobs", 0) or 0) if getattr(job, "logprobs", False) else None
        name = self._names[adapter] if adapter else BASE_ADAPTER
        prefix = None
        if prepared.blocks:
            prefix = self._prefixes.lookup(self._prefix_key(adapter), prepared.blocks, len(prepared.input_ids))
            prepared.cached = prefix.tokens if prefix is not None else 0
        return NewRow(request.key, prepared.input_ids, name, sampler, top, prefix, keep=bool(prepared.blocks))

    def _keep_prefixes(self, admitted: list[_Request], prefilled: dict[int, list[Any]]) -> None:
        """Cache the full blocks of the prompts just prefilled, and count the cache's figures."""
        for request in admitted:
            if request.key in prefilled:
                prepared = request.prepared
                self._prefixes.store(self._prefix_key(prepared.adapter), prepared.blocks, prepared.cached,
                                     prefilled[request.key])  # fmt: skip
        self.stats.count_prefixes(self._prefixes.stats)
