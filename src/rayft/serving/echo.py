"""The ``echo`` requests of ``/v1/completions`` in the router: what the scoring path refuses, and their choices
and stream (the scoring itself is :mod:`rayft.serving.scoring`, in the replica)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from rayft.serving.logprobs import completion_logprobs
from rayft.serving.protocol import DONE, ChatRequest, CompletionRequest, Job, RequestError, ResponseBuilder, Usage, sse
from rayft.serving.scoring import Scored


def echoed(reply: ResponseBuilder, index: int, job: Job, scored: Scored) -> dict[str, Any]:
    """A completions choice of an ``echo`` request: the prompt, then its continuation."""
    tokens = [*scored.prompt, *scored.completion]
    logprobs = completion_logprobs(tokens) if job.logprobs else None
    return reply.choice(index, scored.prompt_text + scored.text, scored.finish_reason, logprobs)


def check_echo(job: Job) -> None:
    """Refuse what the scoring path of ``echo`` does not do, rather than do something else."""
    if job.max_tokens != 0 and job.temperature > 0:
        raise RequestError(
            400, "echo with a completion is decoded greedily; set temperature to 0, or max_tokens to 0 to only "
            "score the prompt", "temperature",
        )  # fmt: skip
    if job.max_tokens != 0 and job.stop:
        raise RequestError(400, "stop is not applied with echo; leave stop out, or set max_tokens to 0", "stop")
    shaping = {
        "top_k": job.top_k,
        "min_p": job.min_p,
        "presence_penalty": job.presence_penalty,
        "frequency_penalty": job.frequency_penalty,
        "repetition_penalty": job.repetition_penalty - 1.0,
    }
    if job.max_tokens != 0 and (named := [name for name, value in shaping.items() if value]):
        raise RequestError(400, f"{named[0]} is not applied with echo, whose continuation is greedy; leave it out, "
                           "or set max_tokens to 0", named[0])  # fmt: skip


async def echo_events(
    reply: ResponseBuilder, choices: list[dict[str, Any]], usage: Usage, request: ChatRequest | CompletionRequest
) -> AsyncIterator[bytes]:
    """A streamed ``echo`` response: each choice whole in one chunk, then its finish reason."""
    for choice in choices:
        yield sse(reply.chunk(choice["text"], index=choice["index"], logprobs=choice["logprobs"]))
        yield sse(reply.chunk(None, choice["finish_reason"], index=choice["index"]))
    if (request.stream_options or {}).get("include_usage"):
        yield sse(reply.usage_chunk(usage))
    yield DONE
