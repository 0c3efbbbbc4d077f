"""Dynamic sampling's choice of groups: a step keeps only groups whose rewards differ, tops them up from the
refill stream to its target within the bound, says when it ran short, and its stream resumes from a cursor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rayft.config.rl import DynamicSamplingConfig
from rayft.evaluation.rewards import Scores
from rayft.training.methods.rl.dynamic_sampling import (
    RefillStream,
    Scored,
    packed_state,
    refilled,
    unpacked_state,
)
from rayft.training.methods.rl.sampling import Completions, PromptBatch

G = 2


def piece(sample_ids: list[int], rewards: list[float]) -> Scored:
    """Scored completions of prompts ``sample_ids`` (``G`` each) with ``rewards``."""
    prompts = [[i, i + 1] for i in sample_ids]
    ids = [[100 + k] for k in range(len(rewards))]
    batch = PromptBatch(prompts, [f"ref{i}" for i in sample_ids], sample_ids)
    completions = Completions(ids, [str(t) for t in ids], len(ids), 0.0)
    return Scored(batch, completions, Scores(rewards, {"f": rewards}, {"f": 0}), rewards)


def windows(units: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    yield units


def stream(count: int) -> RefillStream:
    units = [{"sample_ids": [1000 + i]} for i in range(count)]
    return RefillStream(lambda: windows(units), seed=3, rank=0)


def test_a_step_keeps_only_informative_groups_and_refills_to_its_target() -> None:
    # Step's prompts 1..4: 1 and 3 informative, 2 and 4 scored alike.
    first = [piece([1, 2], [1.0, 0.0, 1.0, 1.0]), piece([3, 4], [0.0, 0.5, 0.0, 0.0])]
    refill = stream(10)
    sampled_rounds: list[int] = []

    def sample(units: list[dict[str, Any]], round_: int) -> Scored:
        sampled_rounds.append(round_)
        ids = [u["sample_ids"][0] for u in units]
        # Extra prompts: only those with an even id differ.
        return piece(ids, [r for i in ids for r in ((1.0, 0.0) if i % 2 == 0 else (1.0, 1.0))])

    kept, carrier, record = refilled(first, refill, DynamicSamplingConfig(max_rounds=3, prompts_per_round=2),
                                     group=G, micro_batch=2, sample=sample)  # fmt: skip
    assert not carrier
    ids = [i for p in kept for i in p.batch.sample_ids]
    order = [u["sample_ids"][0] for u in stream(10).draw(6)]  # the refill stream's (seeded) order
    informative_extra = [i for i in order if i % 2 == 0]
    # The step's informative groups first, then the refilled ones in the order drawn.
    assert ids == [1, 3, *informative_extra[:2]]
    for p in kept:
        for group in p.groups(G):
            assert group.informative, group.batch.sample_ids
    assert all(len(p.batch.prompts) == 2 for p in kept)  # micro-batches of the configured size
    rounds = (order.index(informative_extra[1]) // 2) + 1  # two prompts a round
    assert (record.refill_rounds, record.groups_drawn, record.short_steps) == (rounds, 4 + 2 * rounds, 0)
    assert record.groups_trained == 4
    assert record.groups_dropped == record.groups_drawn - 2 - len([i for i in order[: 2 * rounds] if i % 2 == 0])
    assert sampled_rounds == list(range(1, rounds + 1)) and record.extra_rollouts == 2 * rounds * G
    assert refill.state() == {"passes": 0, "position": 2 * rounds}


def test_a_step_that_stays_short_trains_what_it_has_and_says_so() -> None:
    first = [piece([1, 2], [1.0, 1.0, 0.0, 1.0])]

    def sample(units: list[dict[str, Any]], round_: int) -> Scored:
        ids = [u["sample_ids"][0] for u in units]
        return piece(ids, [0.0] * (G * len(ids)))

    kept, carrier, record = refilled(first, stream(10), DynamicSamplingConfig(max_rounds=2), group=G,
                                     micro_batch=2, sample=sample)  # fmt: skip
    assert [p.batch.sample_ids for p in kept] == [[2]] and not carrier
    assert (record.refill_rounds, record.short_steps, record.groups_drawn, record.groups_dropped) == (2, 1, 6, 5)
    assert record.groups_trained == 1


def test_a_step_with_no_informative_group_keeps_one_in_lockstep() -> None:
    first = [piece([1, 2], [1.0, 1.0, 0.0, 0.0])]

    def sample(units: list[dict[str, Any]], round_: int) -> Scored:
        return piece([u["sample_ids"][0] for u in units], [0.0] * 4)

    kept, carrier, record = refilled(first, stream(4), DynamicSamplingConfig(max_rounds=1), group=G, micro_batch=2,
                                     sample=sample)  # fmt: skip
    assert carrier and [p.batch.sample_ids for p in kept] == [[1]] and record.short_steps == 1
    assert record.groups_trained == 0  # the carrier trains with weight 0


def test_the_refill_stream_resumes_from_its_cursor_and_starts_new_passes() -> None:
    whole = stream(5)
    drawn = [u["sample_ids"][0] for u in whole.draw(3) + whole.draw(4)]
    assert sorted(drawn[:5]) == list(range(1000, 1005)) and whole.state() == {"passes": 1, "position": 2}
    first = stream(5)
    first.draw(3)
    resumed = stream(5)
    rollouts, cursor = unpacked_state(packed_state('{"7": []}', first))
    assert rollouts == '{"7": []}' and cursor is not None
    resumed.restore(cursor)
    assert [u["sample_ids"][0] for u in resumed.draw(4)] == drawn[3:]
    assert unpacked_state('{"7": []}') == ('{"7": []}', None) and unpacked_state(None) == (None, None)
