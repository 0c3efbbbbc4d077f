"""The prompt-prefix cache of ``rayft serve`` (serve.prefix_cache_tokens): a request that starts like an earlier
one prefills only the rest, and decodes what it decodes without the cache."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rayft.serving.engine import Engine
from rayft.serving.prefix_cache import BLOCK_TOKENS, PrefixCache, block_digests
from rayft.serving.rows import Event, Finished, Text
from rayft.serving.scheduler import Limits, Need, plan_admission
from tests.unit.test_serving_engine import _drain, _engine, _job, _staggered

SYSTEM = "You are a careful assistant. Answer briefly and show the steps of any arithmetic. " * 2  # 94 tokens


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.checkpoints import build_lora_checkpoint

    root = tmp_path_factory.mktemp("prefix-adapters")
    return {name: build_lora_checkpoint(root / name, tiny_model_dir, seed=seed, scale=0.5) for name, seed in
            (("alpha", 1), ("beta", 2))}  # fmt: skip


TURNS = ["Question: what is 2 + 3?", "Question: name a prime number.", "Say hello.", "Count to four."]


def _logprobs(events: list[Event]) -> list[tuple[int, float]]:
    return [(lp.token_id, lp.logprob) for e in events if isinstance(e, Text) for lp in e.logprobs or ()]


def _assert_same(cached: list[list[Event]], uncached: list[list[Event]]) -> None:
    for got, expected in zip(cached, uncached, strict=True):
        assert [t for t, _ in _logprobs(got)] == [t for t, _ in _logprobs(expected)]
        assert got[-1] == expected[-1] and isinstance(got[-1], Finished)
        # float32 both ways: with a cached prefix the rest of the prompt is forwarded alone (other matrix shapes,
        # attention over a copy of the prefix's keys and values), so sums run in other orders: ~1e-6 apart
        # (sqrt(64) * 2**-24 * |logit| per layer); abs 1e-4 is far from that and far below the error of a
        # prefix from the wrong adapter or at the wrong positions (~0.1 to 1).
        assert [lp for _, lp in _logprobs(got)] == pytest.approx([lp for _, lp in _logprobs(expected)], abs=1e-4)


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed-steps", "prefill-steps"])
def test_requests_sharing_a_prefix_decode_as_without_the_cache(
    tiny_model_dir: Path, adapter_dirs: dict[str, Path], mixed: bool
) -> None:
    """Each request joins a running batch: the base twice (the second finds the first's prefix), then an adapter
    (the base's prefix is not its own: a miss), the same adapter again (a hit), and a prompt that is the shared
    prefix alone, cut mid-block (a hit of its whole blocks but the one holding its last token)."""
    plan: list[tuple[str, str | None]] = [(SYSTEM + TURNS[0], None), (SYSTEM + TURNS[1], None),
                                          (SYSTEM + TURNS[2], "alpha"), (SYSTEM + TURNS[3], "alpha"),
                                          (SYSTEM[:-3], None)]  # fmt: skip
    jobs = [(_job(prompt, 8, top=2), adapter) for prompt, adapter in plan]
    runs = {}
    for budget in (0, 1024):
        engine = _engine(tiny_model_dir, adapter_dirs, mixed_steps=mixed, prefix_cache_tokens=budget)
        runs[budget] = asyncio.run(_staggered(engine, jobs))
    _assert_same(runs[1024], runs[0])
    stats, ids = engine.stats, [engine.prepare(job, adapter).input_ids for job, adapter in jobs]
    assert stats.joined_running_batch == 4 and stats.prefix_hit_requests == 3
    shared = len(ids[0]) // BLOCK_TOKENS * BLOCK_TOKENS
    # The second base request and the second adapter request find the first's whole prompt blocks of the shared
    # system prompt and beyond it as far as the prompts agree; the shortened prompt its blocks before its last token.
    assert stats.prefix_hit_tokens == sum(_common_blocks(ids[i], ids[j]) for i, j in ((1, 0), (3, 2), (4, 0)))
    assert stats.prefix_queried_tokens == sum(len(i) for i in ids)
    assert stats.prefix_cached_tokens == BLOCK_TOKENS * len({(a, d) for (_, a), i in zip(plan, ids, strict=True)
                                                              for d in block_digests(i)})  # fmt: skip
    assert shared >= 80 and stats.prefill_tokens == stats.prefix_queried_tokens - stats.prefix_hit_tokens


def _common_blocks(ids: list[int], earlier: list[int]) -> int:
    """Tokens of ``ids`` a cache holding ``earlier``'s full blocks hands back: whole equal blocks from the start,
    short of ``ids``'s last token."""
    common = next(
        (i for i, (a, b) in enumerate(zip(ids, earlier, strict=False)) if a != b), min(len(ids), len(earlier))
    )
    return min(common // BLOCK_TOKENS, len(earlier) // BLOCK_TOKENS, (len(ids) - 1) // BLOCK_TOKENS) * BLOCK_TOKENS


def test_rows_with_and_without_a_prefix_prefill_together_as_without_the_cache(
    tiny_model_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    """Five requests that join an empty batch in one prefill step, once the cache holds the shared prompt: two
    find prefixes of different lengths, three find none (another adapter; unrelated prompts, short and long);
    left padding puts each row's prefix and rest at its own offsets."""
    warm = _job(SYSTEM + TURNS[0], 4)
    burst = [(_job(SYSTEM + TURNS[1], 6, top=2), None), (_job(SYSTEM[:40] + TURNS[2], 6, top=2), None),
             (_job("Nothing in common with the system prompt here. " * 4, 6, top=2), None),
             (_job(SYSTEM + TURNS[3], 6, top=2), "beta"), (_job("0 1 2 3 4 5", 6, top=2), None)]  # fmt: skip
    runs = {}
    for budget in (0, 1024):
        engine = _engine(tiny_model_dir, adapter_dirs, prefix_cache_tokens=budget, max_prefill_tokens=4096)
        asyncio.run(_drain(engine.submit(engine.prepare(warm, None)), []))
        runs[budget] = asyncio.run(_together(engine, burst))
    _assert_same(runs[1024], runs[0])
    assert engine.stats.prefix_hit_requests == 2 and engine.stats.prefill_steps == 2


async def _together(engine: Engine, jobs: list[tuple[Any, str | None]]) -> list[list[Event]]:
    sinks: list[list[Event]] = [[] for _ in jobs]
    await asyncio.gather(
        *(_drain(engine.submit(engine.prepare(j, a)), s) for (j, a), s in zip(jobs, sinks, strict=True))
    )
    return sinks


def _blocks(n: int, value: float) -> list[tuple[Any, Any]]:
    import torch

    kv = torch.full((1, 2, n * BLOCK_TOKENS, 4), value)  # [1, kv_heads, tokens, head_dim]
    return [(kv, kv), (kv, kv)]  # two layers


def test_the_cache_keeps_its_budget_evicting_the_deepest_least_recent_blocks_first() -> None:
    cache = PrefixCache(budget_tokens=5 * BLOCK_TOKENS + 3)  # 5 blocks: the rest of a block is not used
    first, second = list(range(4 * BLOCK_TOKENS)), list(range(100, 100 + 3 * BLOCK_TOKENS))
    cache.store("", block_digests(first), 0, _blocks(4, 1.0))
    assert cache.stats.cached_tokens == 4 * BLOCK_TOKENS
    cache.store("", block_digests(second), 0, _blocks(3, 2.0))
    assert cache.stats.cached_tokens == 5 * BLOCK_TOKENS and cache.stats.evicted_blocks == 2
    # The older prompt lost its two deepest blocks, not its first: a lookup still finds its first two.
    prefix = cache.lookup("", block_digests(first), len(first))
    assert prefix is not None and prefix.tokens == 2 * BLOCK_TOKENS
    assert prefix.kv.shape == (
        2,
        2,
        2,
        2 * BLOCK_TOKENS,
        4,
    )  # layers, keys and values, heads and bool((prefix.kv == 1.0).all())
    # The lookup made them the most recent: the next eviction takes the other prompt's deepest block.
    cache.store("", block_digests([7] * BLOCK_TOKENS), 0, _blocks(1, 3.0))
    assert cache.cached_tokens("", block_digests(second), len(second)) == BLOCK_TOKENS * 2
    assert cache.cached_tokens("", block_digests(first), len(first)) == BLOCK_TOKENS * 2
    assert cache.stats.cached_tokens == 5 * BLOCK_TOKENS


def test_a_prefix_serves_only_its_adapter_and_never_a_prompt_s_last_token() -> None:
    cache = PrefixCache(budget_tokens=1024)
    ids = list(range(2 * BLOCK_TOKENS))
    cache.store("alpha\n/a", block_digests(ids), 0, _blocks(2, 1.0))
    assert cache.lookup("", block_digests(ids), len(ids)) is None
    assert cache.cached_tokens("alpha\n/a", block_digests(ids), len(ids)) == BLOCK_TOKENS  # the last token's block
    assert cache.cached_tokens("alpha\n/a", block_digests([*ids, 5]), len(ids) + 1) == 2 * BLOCK_TOKENS
    changed = [*ids[:BLOCK_TOKENS], 999, *ids[BLOCK_TOKENS + 1 :], 5]
    assert cache.cached_tokens("alpha\n/a", block_digests(changed), len(changed)) == BLOCK_TOKENS
    cache.forget("alpha\n/a")
    assert cache.stats.cached_tokens == 0 and not cache.blocks
    assert PrefixCache(budget_tokens=0).budget_blocks == 0


def test_a_cached_prefix_spares_the_prefill_budget_but_not_the_kv_budget() -> None:
    limits = Limits(max_rows=8, kv_tokens=2000, max_queued=8, max_prefill_tokens=64)
    waiting = [Need(300, 20, cached=288) for _ in range(6)]
    assert plan_admission(waiting, [], limits) == 5  # 12 tokens each to prefill: 5 within 64 (the first free)
    assert plan_admission([Need(300, 20) for _ in range(6)], [], limits) == 1
    assert plan_admission(waiting, [Need(300, 20)] * 4, limits) == 2  # 4 x 320 running: room for 2 more of 320
