"""The Ray Serve deployment of one base model: adapters multiplexed by model id, requests batched.

Serve routes a request for an adapter to a replica that has it loaded when it can
(``serve.multiplexed``); a replica keeps at most ``serve.max_adapters_per_replica`` adapters and
unloads the least recently used one first. Each request joins the replica's running batch
(:class:`~rayft.serving.engine.Engine`, continuous batching) and streams its own events back; a
request beyond the replica's waiting queue is refused with 429 and ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from rayft.serving.engine import Engine, EngineSettings, QueueFullError
from rayft.serving.plan import BaseGroup
from rayft.serving.protocol import Job, RequestError
from rayft.serving.rows import Event
from rayft.serving.scoring import Scored


@dataclasses.dataclass(frozen=True)
class Started:
    """The first event of an accepted request: how many tokens its prompt took."""

    prompt_tokens: int


@dataclasses.dataclass(frozen=True)
class Refused:
    """The only event of a refused request: the HTTP status, OpenAI error body and response headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


class _AdapterSlot:
    """What Serve's multiplexing cache holds per adapter; dropping it from the cache unloads the weights."""

    def __init__(self, engine: Engine, model_id: str) -> None:
        self.engine, self.model_id, self.unloaded = engine, model_id, False

    def __del__(self) -> None:  # Serve calls this (on a thread) when the adapter leaves its cache
        if not self.unloaded:
            self.unloaded = True
            self.engine.unload_adapter(self.model_id)


def replica_class(max_adapters: int) -> type:
    """The deployment class, with the adapter cache size of ``serve:`` (Serve takes it at decoration)."""

    # Serve's decorator is typed for plain functions; this method is what it takes at run time.
    multiplexed: Any = serve.multiplexed(max_num_models_per_replica=max_adapters)

    class ModelReplica:
        """One replica of a base model's deployment."""

        def __init__(self, group: BaseGroup, settings: EngineSettings, access_log_console: bool = False) -> None:
            from rayft.models.loading import hide_unused_bitsandbytes
            from rayft.security import install_redaction
            from rayft.serving.access_log import quiet_serve_console

            install_redaction()
            quiet_serve_console(keep_access=access_log_console)
            # The replica's process serves this one base for its life, unquantized unless its checkpoint says
            # so: PEFT, which loads the adapters, would import bitsandbytes (about 1 CPU-s of start) for nothing.
            hide_unused_bitsandbytes(group.model, "none")
            self.engine = Engine(group, settings)

        @multiplexed  # type: ignore[untyped-decorator]
        async def adapter(self, model_id: str) -> _AdapterSlot:
            await asyncio.to_thread(self.engine.load_adapter, model_id)
            return _AdapterSlot(self.engine, model_id)

        async def _use(self, adapter: str | None, source: str | None) -> None:
            """Have the request's adapter loaded: registered first when it was loaded at run time (``source``)."""
            if adapter is None:
                return
            known = self.engine.adapters.get(adapter)
            if source is not None and (known is None or known.path != source):
                await asyncio.to_thread(self.engine.register, adapter, source)
            await self.adapter(adapter)

        async def add_adapter(self, source: str) -> Refused | None:
            """Load the adapter at ``source`` as the request's multiplexed model id (``POST /v1/load_lora_adapter``):
            None once loaded, or the 400 saying why it cannot be."""
            model_id = serve.get_multiplexed_model_id()
            try:
                await asyncio.to_thread(self.engine.register, model_id, source)
                # Loaded here, not only through Serve's cache, which may still hold this id from before an unload.
                await asyncio.to_thread(self.engine.load_adapter, model_id)
                await self.adapter(model_id)
            except RequestError as error:
                await asyncio.to_thread(self.engine.forget, model_id)
                return Refused(error.status, error.body())
            return None

        def remove_adapter(self, model_id: str) -> None:
            """Unload an adapter loaded at run time (``POST /v1/unload_lora_adapter``, or evicted past the limit)."""
            self.engine.forget(model_id)

        async def generate(self, job: Job, source: str | None = None) -> AsyncIterator[Started | Refused | Event]:
            """Stream one request: :class:`Started` (or :class:`Refused`), its text, then its end (``source``: where
            an adapter loaded at run time comes from, for a replica that has not loaded it yet)."""
            adapter = serve.get_multiplexed_model_id() or None
            try:
                self.engine.admit()
                await self._use(adapter, source)
                if job.tools.guide is None:
                    prepared = self.engine.prepare(job, adapter)
                else:  # compiling the grammar (and, once, reading the vocabulary) keeps the loop free
                    prepared = await asyncio.to_thread(self.engine.prepare, job, adapter)
                events = self.engine.submit(prepared)
                first = await anext(events)  # a full queue refuses here, before anything is sent
            except QueueFullError as error:
                yield Refused(error.status, error.body(), {"Retry-After": str(error.retry_after_s)})
                return
            except RequestError as error:
                yield Refused(error.status, error.body())
                return
            # A client gone mid-stream: Serve cancels this generator, which closes the engine's
            # stream, whose row leaves the batch before the next step.
            async with contextlib.aclosing(events):
                yield Started(len(prepared.input_ids))
                yield first
                async for event in events:
                    yield event

        async def score(self, job: Job, source: str | None = None) -> Scored | Refused:
            """An ``echo`` request: the prompt's token log-probabilities and a greedy continuation."""
            adapter = serve.get_multiplexed_model_id() or None
            try:
                await self._use(adapter, source)
                return await asyncio.to_thread(self.engine.score, job, adapter)
            except RequestError as error:
                return Refused(error.status, error.body())

        def ready(self) -> bool:
            """True: a replica answers only once its model is loaded (the router's health check)."""
            return True

        def load(self) -> dict[str, Any]:
            """Requests waiting and running per adapter, KV cache reserved, adapters loaded (the metrics' gauges)."""
            return self.engine.load()

        def stats(self) -> dict[str, Any]:
            """The engine's counters (loads, unloads, steps, rows in flight, refusals)."""
            return dataclasses.asdict(self.engine.stats)

    return ModelReplica
