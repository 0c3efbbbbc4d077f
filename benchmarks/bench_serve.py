"""`rayft serve` under load against `rayft generate` on the same prompts, in one run, on one local Ray.

A fixed number of streamed chat requests (greedy, the same max_tokens) is sent with the real
`openai` client at each concurrency, each level after the server has started and warmed up (its
start-up is not timed; the replica batches continuously, `serve.max_batch_size` rows); per level:
p50/p95 latency, p50/p95 time to first token and generated tokens/s (completion tokens of all
requests / wall time of the level). The offline arm is
`rayft generate` over the same prompts as a JSON Lines file (batch 16), end to end (its model load
and actor start included), and without its fixed cost (a 1-prompt run's time subtracted). It runs
twice, before the server starts and after it stops, and the ratios are against each run and their
mean: on a shared machine the offline figure moves between runs, and one run alone cannot show by
how much. Both arms get the same CPUs: the Serve replica and the generate actor each reserve --cpus.
The replica prefills joining requests in its running rows' decoding steps (`serve.mixed_steps`, the
default); `--prefill-steps` serves with prefill steps of their own instead, for the comparison.

    .venv/bin/python benchmarks/bench_serve.py [--model smollm2-135m-instruct] [--requests 32]
        [--max-tokens 48] [--concurrency 1 4 16] [--cpus 2] [--prefill-steps]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_generation_batching import prompts  # the same GSM8K-like chat prompts as the batching benchmark


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def one_request(
    client: object, model: str, messages: list[dict[str, str]], max_tokens: int
) -> tuple[float, float, int]:
    """(latency s, time to first token s, completion tokens) of one streamed request."""
    import openai

    assert isinstance(client, openai.AsyncOpenAI)
    started = time.perf_counter()
    first = None
    tokens = 0
    stream = await client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    latency = time.perf_counter() - started
    return latency, first if first is not None else latency, tokens


async def load_level(base_url: str, model: str, batch: list[list[dict[str, str]]], concurrency: int,
                     max_tokens: int) -> dict[str, float]:  # fmt: skip
    import openai

    gate = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600) as client:

        async def gated(messages: list[dict[str, str]]) -> tuple[float, float, int]:
            async with gate:
                return await one_request(client, model, messages, max_tokens)

        started = time.perf_counter()
        results = await asyncio.gather(*(gated(m) for m in batch))
        wall = time.perf_counter() - started
    latencies, ttfts, tokens = ([r[i] for r in results] for i in range(3))
    return {
        "p50_latency_s": statistics.median(latencies), "p95_latency_s": percentile(latencies, 0.95),  # type: ignore[arg-type]
        "p50_ttft_s": statistics.median(ttfts), "p95_ttft_s": percentile(ttfts, 0.95),  # type: ignore[arg-type]
        "mean_ttft_s": statistics.mean(ttfts),  # type: ignore[arg-type]
        "tokens": sum(tokens), "tokens_per_s": sum(tokens) / wall, "wall_s": wall,  # type: ignore[arg-type]
    }  # fmt: skip


def replica_stats(base_url: str) -> dict[str, float]:
    """The replica's engine counters (``/rayft/stats``; the benchmark's deployment has one replica)."""
    import httpx

    deployments = httpx.get(base_url.removesuffix("/v1") + "/rayft/stats", timeout=60).json()["deployments"]
    return {k: v for k, v in deployments[0].items() if isinstance(v, int | float)}


def time_split(before: dict[str, float], after: dict[str, float], mean_ttft_s: float) -> dict[str, float]:
    """Where the requests of one level spent their time, from the engine's counters over the level."""
    d = {k: after[k] - before[k] for k in after}
    admitted, prefills, decodes = max(d["admitted"], 1), max(d["prefill_steps"], 1), max(d["decode_steps"], 1)
    first = d["first_token_s"] / admitted
    return {
        "queued_s": d["queued_s"] / admitted, "engine_first_token_s": first, "outside_engine_s": mean_ttft_s - first,
        "prefill_steps": d["prefill_steps"], "mixed_steps": d["mixed_steps"],
        "prefill_step_s": d["prefill_s"] / prefills,
        "prefill_tokens_per_step": d["prefill_tokens"] / prefills, "padding_share": d["prefill_padding"] / max(
            d["prefill_padding"] + d["prefill_tokens"], 1),
        "decode_steps": d["decode_steps"], "decode_step_s": d["decode_s"] / decodes, "rows_per_decode": d[
            "decode_rows"] / decodes,
    }  # fmt: skip


def offline(
    model: str, batch: list[list[dict[str, str]]], max_tokens: int, cpus: float, work: Path
) -> dict[str, float]:
    import rayft

    cfg = rayft.RayftConfig.model_validate(
        {"inference": {"temperature": 0, "max_new_tokens": max_tokens, "batch_size": 16, "num_cpus_per_worker": cpus}}
    )
    runs = {}
    for name, rows in (("one", batch[:1]), ("all", batch)):
        source = work / f"{name}.jsonl"
        source.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows), encoding="utf-8")
        runs[name] = rayft.api.generate(cfg, model, source, work / f"{name}.out.jsonl")
    full, fixed = runs["all"], runs["one"]
    return {
        "tokens": full.generated_tokens,
        "elapsed_s": full.elapsed_s,
        "tokens_per_s": full.generated_tokens / full.elapsed_s,
        "tokens_per_s_without_startup": (full.generated_tokens - fixed.generated_tokens)
        / max(full.elapsed_s - fixed.elapsed_s, 1e-9),
    }


def print_split(splits: dict[int, dict[str, float]]) -> None:
    """Where the time to first token goes, per level (means over the level's requests and steps)."""
    print(
        "| level | mean TTFT: queued s | engine first token s | outside the engine s | prefill steps (mixed) | "
        "s/prefill step | prompt tokens/step | padding | decode steps | s/decode step | rows/decode step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for concurrency, m in splits.items():
        print(
            f"| concurrency {concurrency} | {m['queued_s']:.3f} | {m['engine_first_token_s']:.3f} | "
            f"{m['outside_engine_s']:.3f} | {m['prefill_steps']:.0f} ({m['mixed_steps']:.0f}) | "
            f"{m['prefill_step_s']:.3f} | "
            f"{m['prefill_tokens_per_step']:.0f} | {m['padding_share']:.0%} | {m['decode_steps']:.0f} | "
            f"{m['decode_step_s']:.3f} | {m['rows_per_decode']:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--cpus", type=float, default=2)
    parser.add_argument("--prefill-steps", action="store_true", help="serve.mixed_steps: false")
    args = parser.parse_args()

    import rayft
    from rayft.testing.ray_cluster import start_local_ray

    start_local_ray(num_cpus=int(args.cpus))
    batch = prompts(args.requests)

    def offline_run() -> dict[str, float]:
        with tempfile.TemporaryDirectory() as work:
            return offline(args.model, batch, args.max_tokens, args.cpus, Path(work))

    bases = [offline_run()]
    cfg = rayft.RayftConfig.model_validate(
        {
            "serve": {
                "num_cpus_per_replica": args.cpus,
                "max_batch_size": 16,
                "max_tokens": args.max_tokens,
                "mixed_steps": not args.prefill_steps,
            }
        }
    )
    levels, splits = {}, {}
    with rayft.api.serve(cfg, [args.model], port=0) as server:
        model = server.model_ids[0]
        asyncio.run(load_level(server.base_url, model, batch[:2], 2, 4))  # warm-up
        for concurrency in args.concurrency:
            before = replica_stats(server.base_url)
            levels[concurrency] = asyncio.run(load_level(server.base_url, model, batch, concurrency, args.max_tokens))
            split = time_split(before, replica_stats(server.base_url), levels[concurrency]["mean_ttft_s"])
            splits[concurrency] = split
            print(f"concurrency {concurrency}: {levels[concurrency]} {split}", flush=True)
    bases.append(offline_run())
    print(f"command: {' '.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}")
    print(
        f"model {args.model}, {args.requests} requests, max_tokens {args.max_tokens}, {args.cpus:g} CPUs per arm, "
        f"serve.mixed_steps {not args.prefill_steps}"
    )
    print("| arm | p50 latency s | p95 latency s | p50 TTFT s | p95 TTFT s | tokens | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for concurrency, m in levels.items():
        latency = f"{m['p50_latency_s']:.2f} | {m['p95_latency_s']:.2f} | {m['p50_ttft_s']:.2f} | {m['p95_ttft_s']:.2f}"
        print(f"| serve, concurrency {concurrency} | {latency} | {m['tokens']:.0f} | {m['tokens_per_s']:.1f} |")
    for when, base in zip(("before", "after"), bases, strict=True):
        print(f"| rayft generate (batch 16) {when} serving, end to end | - | - | - | - | {base['tokens']:.0f} | "
              f"{base['tokens_per_s']:.1f} |")  # fmt: skip
        print(f"| rayft generate {when} serving, without its start-up | - | - | - | - | - | "
              f"{base['tokens_per_s_without_startup']:.1f} |")  # fmt: skip
    print_split(splits)
    top = levels[max(levels)]["tokens_per_s"]
    for key, what in (("tokens_per_s", "end to end"), ("tokens_per_s_without_startup", "without its start-up")):
        figures = [base[key] for base in bases]
        ratios = ", ".join(f"{top / f:.2f}x" for f in figures)
        print(f"serve at concurrency {max(levels)} / generate {what}: {top / statistics.mean(figures):.2f}x of "
              f"their mean (before, after serving: {ratios}; target >= 0.7x without its start-up)")  # fmt: skip
    low, high = min(levels), max(levels)
    ttft = levels[high]["p50_ttft_s"] / levels[low]["p50_ttft_s"]
    print(f"p50 time to first token at concurrency {high} / at {low}: {ttft:.2f}x (target <= 3x)")


if __name__ == "__main__":
    main()
