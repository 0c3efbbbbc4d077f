"""`rayft serve` with and without its prompt-prefix cache: concurrent streams that share a long system prompt.

Each arm starts a real server of SmolLM2-135M-Instruct (rayft's offline copy) on one local Ray, warms it with
one short request (another system prompt: the shared one is not cached before the round), then sends
``--streams`` streamed chat requests at once with the real `openai` client: one long system prompt (about
``--system-tokens`` tokens), each with its own short user turn (GSM8K-like questions), greedy,
``--max-tokens`` each. Figures per arm: p50/p95 time to first token, p50/p95 latency, generated tokens/s over
the round's wall time, the replica's prefill steps and tokens, and its cache's hit rate (``/rayft/stats``
and ``/metrics``); then the ratios of the cache on to off. The first request of the round finds nothing
cached (it prefills the whole prompt); the others find the shared prompt's full blocks once it has run.

    .venv/bin/python benchmarks/bench_serve_prefix.py [--streams 16] [--system-tokens 700] [--max-tokens 16]
        [--cache-tokens 4096] [--cpus 2]

``benchmarks/bench_rl.py --server-prefix`` runs it with the same arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from bench_generation_batching import prompts  # the same GSM8K-like chat prompts as the batching benchmark
from bench_serve import load_level, replica_stats

MODEL = "smollm2-135m-instruct"
RULES = [
    "Read the question twice before answering, and name the quantities it gives.",
    "Write each step of the arithmetic on its own line, with the operation spelled out.",
    "Check every intermediate result by the inverse operation before you use it.",
    "Give units with every number that has one, and convert them before adding.",
    "When a question is ambiguous, say which reading you take and why.",
    "End with a line 'Answer: N' where N is the final number alone.",
]


def system_prompt(tokens: int) -> str:
    """A long system prompt of about ``tokens`` tokens (numbered rules, each about 18 tokens)."""
    lines = ["You are a careful tutor for grade-school arithmetic. Follow these rules."]
    for index in range(max(1, tokens // 18)):
        lines.append(f"Rule {index + 1}: {RULES[index % len(RULES)]}")
    return "\n".join(lines)


def conversations(streams: int, system_tokens: int) -> list[list[dict[str, str]]]:
    """``streams`` chats: the shared system prompt, then each its own user turn."""
    system = system_prompt(system_tokens)
    turns = [next(m["content"] for m in chat if m["role"] == "user") for chat in prompts(streams)]
    return [[{"role": "system", "content": system}, {"role": "user", "content": turn}] for turn in turns]


def hit_ratio_on_metrics(base_url: str) -> float | None:
    """``rayft_serve_prefix_cache_hit_ratio`` as ``/metrics`` shows it (None when absent)."""
    import httpx

    body = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=60).text
    line = next((x for x in body.splitlines() if x.startswith("rayft_serve_prefix_cache_hit_ratio{")), None)
    return float(line.rsplit(" ", 1)[1]) if line else None


def arm(args: argparse.Namespace, cache_tokens: int, chats: list[list[dict[str, str]]]) -> dict[str, float]:
    """One server, one warm-up, one round of ``args.streams`` concurrent streams; its figures."""
    import rayft

    serve = {"num_cpus_per_replica": args.cpus, "max_batch_size": args.streams, "max_tokens": args.max_tokens,
             "prefix_cache_tokens": cache_tokens}  # fmt: skip
    cfg = rayft.RayftConfig.model_validate({"serve": serve})
    with rayft.api.serve(cfg, [MODEL], port=0) as server:
        model = server.model_ids[0]
        warm = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]]
        asyncio.run(load_level(server.base_url, model, warm, 1, 4))
        before = replica_stats(server.base_url)
        level = asyncio.run(load_level(server.base_url, model, chats, len(chats), args.max_tokens))
        after = replica_stats(server.base_url)
        metrics_ratio = hit_ratio_on_metrics(server.base_url)
    diff = {k: after[k] - before.get(k, 0) for k in after}
    queried = max(diff.get("prefix_queried_tokens", 0), 1)
    return {**level, "prefill_steps": diff["prefill_steps"], "prefill_tokens": diff["prefill_tokens"],
            "prefill_s": diff["prefill_s"], "hit_rate": diff.get("prefix_hit_tokens", 0) / queried,
            "hit_requests": diff.get("prefix_hit_requests", 0), "metrics_hit_ratio": metrics_ratio or 0.0}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--system-tokens", type=int, default=700, help="about this many tokens of system prompt")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--cache-tokens", type=int, default=4096, help="serve.prefix_cache_tokens of the cached arm")
    parser.add_argument("--cpus", type=float, default=2)
    args = parser.parse_args(argv)

    from rayft.testing.ray_cluster import start_local_ray

    start_local_ray(num_cpus=int(args.cpus))
    chats = conversations(args.streams, args.system_tokens)
    arms = {"off": arm(args, 0, chats), "on": arm(args, args.cache_tokens, chats)}
    print(f"command: {' '.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}")
    print(f"model {MODEL}, {args.streams} concurrent streams sharing a system prompt of ~{args.system_tokens} "
          f"tokens, max_tokens {args.max_tokens}, {args.cpus:g} CPUs, prefix cache of the 'on' arm "
          f"{args.cache_tokens} tokens")  # fmt: skip
    print(
        "| prefix cache | p50 TTFT s | p95 TTFT s | p50 latency s | p95 latency s | tokens/s | prefill steps | "
        "prefill tokens | prefill s | hit rate (stats, /metrics) | requests that hit |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, m in arms.items():
        print(f"| {name} | {m['p50_ttft_s']:.2f} | {m['p95_ttft_s']:.2f} | {m['p50_latency_s']:.2f} | "
              f"{m['p95_latency_s']:.2f} | {m['tokens_per_s']:.1f} | {m['prefill_steps']:.0f} | "
              f"{m['prefill_tokens']:.0f} | {m['prefill_s']:.2f} | {m['hit_rate']:.2f}, {m['metrics_hit_ratio']:.2f} | "
              f"{m['hit_requests']:.0f} |")  # fmt: skip
    off, on = arms["off"], arms["on"]
    print(f"on / off: p50 TTFT {on['p50_ttft_s'] / off['p50_ttft_s']:.2f}x, p95 TTFT "
          f"{on['p95_ttft_s'] / off['p95_ttft_s']:.2f}x, tokens/s {on['tokens_per_s'] / off['tokens_per_s']:.2f}x, "
          f"prefill tokens {on['prefill_tokens'] / max(off['prefill_tokens'], 1):.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
