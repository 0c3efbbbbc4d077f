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
