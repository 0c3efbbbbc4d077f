"""Structured outputs in `rayft serve`: generated tokens/s with a JSON schema (and with a forced tool call)
against free text, at 1 and 16 concurrent streams, on one server in one run.

Each level sends the same chat requests (greedy, the same max_tokens) with the real `openai` client, at
most ``concurrency`` at a time: free text, then ``response_format: json_schema``, then two tools under
``tool_choice: auto`` and under ``tool_choice: required``, then free text again. tokens/s is the
completion tokens of all requests over the level's wall time; each arm's ratio is against the mean of
the two free-text runs of the same level (on a shared machine the baseline moves between runs, and the
two runs show by how much). The tools arms' prompts are longer (the tool list goes into the system
message), so the forced call is also compared with the same prompts under ``tool_choice: auto``
(unconstrained). The constrained rows compute their grammar's allowed tokens (llguidance) at every step
beside the model's forward (``src/rayft/serving/grammar.py``).

    .venv/bin/python benchmarks/bench_structured.py [--model smollm2-135m-instruct] [--requests 16]
        [--max-tokens 48] [--concurrency 1 16] [--cpus 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 40},
    "hobbies": {"type": "array", "maxItems": 5, "items": {"type": "string", "maxLength": 30}}},
    "required": ["name", "age", "city", "hobbies"], "additionalProperties": False}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "lookup_person", "description": "Find a person's record.",
                                      "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                                                     "required": ["name"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]  # fmt: skip
PEOPLE = ["Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances", "John"]
ARMS: dict[str, dict[str, Any]] = {
    "free text": {},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}},
    "tools, tool_choice auto": {"tools": TOOLS, "tool_choice": "auto"},
    "tool_choice required": {"tools": TOOLS, "tool_choice": "required"},
}


def prompts(count: int) -> list[list[dict[str, str]]]:
    """Requests for a person's record as JSON, each about another person."""
    return [[{"role": "user", "content": f"Describe {PEOPLE[i % len(PEOPLE)]}, born in {1900 + 7 * i}, as a JSON "
              "record with name, age, city and hobbies."}] for i in range(count)]  # fmt: skip


async def level(base_url: str, model: str, batch: list[list[dict[str, str]]], concurrency: int, *, max_tokens: int,
                fields: dict[str, Any]) -> dict[str, float]:  # fmt: skip
    """Completion tokens, wall time and tokens/s of the batch at ``concurrency`` streams."""
    import openai

    gate = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600) as client:

        async def one(messages: list[dict[str, str]]) -> int:
            async with gate:
                stream = await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,  # type: ignore[arg-type]
                    stream_options={"include_usage": True}, **fields,
                )  # fmt: skip
                tokens = 0
                async for chunk in stream:
                    if chunk.usage is not None:
                        tokens = chunk.usage.completion_tokens
                return tokens

        started = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(m) for m in batch)))
        wall = time.perf_counter() - started
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--cpus", type=float, default=2)
    args = parser.parse_args()

    import rayft
    from rayft.testing.ray_cluster import start_local_ray

    start_local_ray(num_cpus=int(args.cpus))
    batch = prompts(args.requests)
    cfg = rayft.RayftConfig.model_validate({"serve": {"num_cpus_per_replica": args.cpus, "max_batch_size": 16,
                                                      "max_tokens": args.max_tokens}})  # fmt: skip
    rows: list[tuple[int, str, dict[str, float]]] = []
    with rayft.api.serve(cfg, [args.model], port=0) as server:
        model = server.model_ids[0]
        for fields in ARMS.values():  # warm-up: the model's first steps, and the grammar library's vocabulary
            asyncio.run(level(server.base_url, model, batch[:2], 2, max_tokens=4, fields=fields))
        for concurrency in args.concurrency:
            for arm in [*ARMS, "free text"]:
                figures = asyncio.run(
                    level(server.base_url, model, batch, concurrency, max_tokens=args.max_tokens, fields=ARMS[arm])
                )
                rows.append((concurrency, arm, figures))
                print(f"concurrency {concurrency}, {arm}: {figures}", flush=True)
    print(f"command: {' '.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}")
    print(f"model {args.model}, {args.requests} requests per arm, max_tokens {args.max_tokens}, greedy, "
          f"{args.cpus:g} CPUs")  # fmt: skip
    print("| streams | arm | tokens | wall s | tokens/s | / free text (mean of its two runs) | / tools, auto |")
    print("|---|---|---|---|---|---|---|")
    for concurrency in args.concurrency:
        these = [(arm, f) for c, arm, f in rows if c == concurrency]
        base = statistics.mean(f["tokens_per_s"] for arm, f in these if arm == "free text")
        auto = next(f["tokens_per_s"] for arm, f in these if arm == "tools, tool_choice auto")
        for arm, f in these:
            versus_auto = f"{f['tokens_per_s'] / auto:.2f}x" if arm.startswith("tool") else "-"
            print(f"| {concurrency} | {arm} | {f['tokens']:.0f} | {f['wall_s']:.1f} | {f['tokens_per_s']:.1f} | "
                  f"{f['tokens_per_s'] / base:.2f}x | {versus_auto} |")  # fmt: skip


if __name__ == "__main__":
    main()
