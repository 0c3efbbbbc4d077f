"""The admission plan of `rayft serve`'s continuous batching: rows, KV budget, prefill bound, queue bound."""

from __future__ import annotations

from rayft.serving.scheduler import Limits, Need, plan_admission, prefill_turn, queue_full, retry_after_s

LIMITS = Limits(max_rows=4, kv_tokens=1000, max_queued=2, max_prefill_tokens=300)


def test_requests_join_in_order_while_rows_and_kv_budget_last() -> None:
    assert plan_admission([Need(10, 90)] * 6, [], LIMITS) == 4  # rows
    assert plan_admission([Need(10, 90)] * 3, [Need(10, 90)] * 3, LIMITS) == 1
    assert plan_admission([Need(100, 300), Need(100, 300), Need(100, 300)], [], LIMITS) == 2  # 800 of 1000 tokens
    assert plan_admission([Need(10, 90)], [Need(500, 450)], LIMITS) == 0  # 950 reserved: 100 more do not fit


def test_a_request_that_does_not_fit_waits_at_the_head_and_nobody_overtakes_it() -> None:
    assert plan_admission([Need(400, 400), Need(10, 10)], [Need(100, 200)], LIMITS) == 0


def test_prefill_per_step_is_bounded_but_a_long_prompt_still_joins_alone() -> None:
    assert plan_admission([Need(200, 10), Need(200, 10)], [], LIMITS) == 1
    assert plan_admission([Need(600, 10), Need(10, 10)], [], LIMITS) == 1
    assert plan_admission([Need(100, 10)] * 3, [], LIMITS) == 3


def test_the_queue_is_bounded_and_a_refusal_says_when_to_retry() -> None:
    assert not queue_full(1, LIMITS) and queue_full(2, LIMITS)
    assert queue_full(0, Limits(4, 1000, 0, 300))
    assert retry_after_s([], 0.5) == 1
    assert retry_after_s([40, 10], 0.5) == 5
    assert retry_after_s([1], 0.01) == 1


def test_prefill_and_decoding_steps_alternate_while_rows_run() -> None:
    assert prefill_turn(prefilled_last_step=False, running_rows=3)
    assert not prefill_turn(prefilled_last_step=True, running_rows=3)  # the running rows decode first
    assert prefill_turn(prefilled_last_step=True, running_rows=0)  # nothing to decode: prefill on
    assert prefill_turn(prefilled_last_step=True, running_rows=3, mixed=True)  # every mixed step decodes them


def _end_steps(arrivals: int, limits: Limits, need: Need) -> list[int]:
    """The step at which each of ``arrivals`` requests that come at once ends, by the planner's decisions (a
    prefill step gives a row its first token, each decoding step one more)."""
    waiting, left, ends, prefilled = [need] * arrivals, list[int](), list[int](), False  # left: tokens to go
    for step in range(1, 10_000):
        if not (waiting or left):
            return ends
        running = [need] * len(left)
        count = plan_admission(waiting, running, limits) if prefill_turn(prefilled, len(left)) else 0
        prefilled = count > 0
        if prefilled:
            del waiting[:count]
            left += [need.max_tokens - 1] * count
            continue
        left = [n - 1 for n in left]
        ends += [step] * left.count(0)
        left = [n for n in left if n]
    raise AssertionError("the requests never ended")


def test_a_prefill_budget_of_one_prompt_spreads_a_burst_so_no_two_rows_end_together() -> None:
    prompt = Need(56, 48)
    one = Limits(max_rows=16, kv_tokens=32768, max_queued=48, max_prefill_tokens=64)
    ends = _end_steps(16, one, prompt)
    assert len(ends) == 16 and len(set(ends)) == 16  # each client's next request arrives on its own
    four = Limits(max_rows=16, kv_tokens=32768, max_queued=48, max_prefill_tokens=256)
    assert len(set(_end_steps(16, four, prompt))) == 4  # four rows a step: they end, and come back, in fours


def test_short_prompts_share_a_prefill_step_within_the_budget() -> None:
    one = Limits(max_rows=16, kv_tokens=32768, max_queued=48, max_prefill_tokens=64)
    assert plan_admission([Need(56, 48)] * 3, [Need(56, 48)], one) == 1
    assert plan_admission([Need(10, 48)] * 8, [Need(56, 48)], one) == 6  # 60 of 64 tokens
