"""The Ray Serve deployment of one base model: adapters multiplexed by model id, requests batched.

Serve routes a request for an adapter to a replica that has it loaded when it can
(``serve.multiplexed``); a replica keeps at most ``serve.max_adapters_per_replica`` adapters and
unloads the least recently used one first. Requests queue in ``serve.batch`` and a batch decodes
together (:class:`~rayft.serving.engine.Engine`), each request streaming its own events back.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from rayft.serving.engine import Engine, EngineSettings, Event, Finished, Prepared
from rayft.serving.plan import BaseGroup
from rayft.serving.protocol import Job, RequestError
from rayft.serving.scoring import Scored


@dataclasses.dataclass(frozen=True)
class Started:
    """The first event of an accepted request: how many tokens its prompt took."""

    prompt_tokens: int


@dataclasses.dataclass(frozen=True)
class Refused:
    """The only event of a refused request: the HTTP status and OpenAI error body."""

    status: int
    body: dict[str, Any]


class _AdapterSlot:
    """What Serve's multiplexing cache holds per adapter; dropping it from the cache unloads the weights."""

    def __init__(self, engine: Engine, model_id: str) -> None:
        self.engine, self.model_id, self.unloaded = engine, model_id, False

    def __del__(self) -> None:  # Serve calls this (on a thread) when the adapter leaves its cache
        if not self.unloaded:
            self.unloaded = True
            self.engine.unload_adapter(self.model_id)


def replica_class(max_adapters: int, max_batch_size: int, batch_wait_timeout_s: float) -> type:
    """The deployment class, with the cache and batch sizes of ``serve:`` (Serve takes them at decoration)."""

    # Serve's decorators are typed for plain functions; these methods are what they take at run time.
    multiplexed: Any = serve.multiplexed(max_num_models_per_replica=max_adapters)
    batched: Any = serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)

    class ModelReplica:
        """One replica of a base model's deployment."""

        def __init__(self, group: BaseGroup, settings: EngineSettings, access_log_console: bool = False) -> None:
            from rayft.security import install_redaction
            from rayft.serving.access_log import hide_access_log_from_console

            install_redaction()
            if not access_log_console:
                hide_access_log_from_console()
            self.engine = Engine(group, settings)

        @multiplexed  # type: ignore[untyped-decorator]
        async def adapter(self, model_id: str) -> _AdapterSlot:
            await asyncio.to_thread(self.engine.load_adapter, model_id)
            return _AdapterSlot(self.engine, model_id)

        async def generate(self, job: Job) -> AsyncIterator[Started | Refused | Event]:
            """Stream one request: :class:`Started` (or :class:`Refused`), its text, then :class:`Finished`."""
            adapter = serve.get_multiplexed_model_id() or None
            try:
                if adapter is not None:
                    await self.adapter(adapter)
                prepared = self.engine.prepare(job, adapter)
            except RequestError as error:
                yield Refused(error.status, error.body())
                return
            yield Started(len(prepared.input_ids))
            finished = False
            try:
                async for events in self._batch(prepared):
                    for event in events or ():
                        finished = finished or isinstance(event, Finished)
                        yield event
            finally:
                # A client gone mid-stream (Serve cancels this generator): its row stops at the next step.
                prepared.cancelled = not finished

        async def score(self, job: Job) -> Scored | Refused:
            """An ``echo`` request: the prompt's token log-probabilities and a greedy continuation."""
            adapter = serve.get_multiplexed_model_id() or None
            try:
                if adapter is not None:
                    await self.adapter(adapter)
                return await asyncio.to_thread(self.engine.score, job, adapter)
            except RequestError as error:
                return Refused(error.status, error.body())

        def ready(self) -> bool:
            """True: a replica answers only once its model is loaded (the router's health check)."""
            return True

        @batched  # type: ignore[untyped-decorator]
        async def _batch(self, requests: list[Prepared]) -> AsyncIterator[list[Any]]:
            finished = [False] * len(requests)
            async for updates in self.engine.run_batch(requests):
                out: list[Any] = []
                for index, events in enumerate(updates):
                    out.append(StopIteration if finished[index] else events)
                    finished[index] = finished[index] or any(isinstance(e, Finished) for e in events or ())
                yield out
            yield [StopIteration] * len(requests)

        def stats(self) -> dict[str, Any]:
            """The engine's counters (loads, unloads, batches, rows in flight)."""
            return dataclasses.asdict(self.engine.stats)

    return ModelReplica
