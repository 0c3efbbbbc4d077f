"""The order in which a worker consumes units: deterministic, exact to resume, batch-size free."""

from __future__ import annotations

from itertools import chain

from rayft.training.loop.batches import epoch_micro_batches, shuffled_units


def windows(n: int, size: int) -> list[list[dict[str, int]]]:
    units = [{"id": i} for i in range(n)]
    return [units[i : i + size] for i in range(0, n, size)]


def ids(batches: list[list[dict[str, int]]]) -> list[int]:
    return [u["id"] for u in chain.from_iterable(batches)]


def test_each_epoch_is_a_permutation_that_depends_only_on_seed_epoch_rank() -> None:
    first = [u["id"] for u in shuffled_units(windows(50, 20), seed=1, epoch=0, rank=0)]
    again = [u["id"] for u in shuffled_units(windows(50, 20), seed=1, epoch=0, rank=0)]
    other_epoch = [u["id"] for u in shuffled_units(windows(50, 20), seed=1, epoch=1, rank=0)]
    assert first == again
    assert sorted(first) == list(range(50))
    assert first != other_epoch and sorted(other_epoch) == list(range(50))


def test_skipping_resumes_exactly_where_a_run_stopped() -> None:
    def run(skip: int) -> list[int]:
        return ids(list(epoch_micro_batches(windows(40, 16), seed=3, epoch=2, rank=1, micro_batch_size=4,
                                            units_per_rank=40, skip_units=skip)))  # fmt: skip

    assert run(12) == run(0)[12:]


def test_micro_batch_size_does_not_change_which_units_a_step_sees() -> None:
    def steps(micro: int, accum: int) -> list[list[int]]:
        batches = list(epoch_micro_batches(windows(32, 32), seed=0, epoch=0, rank=0, micro_batch_size=micro,
                                           units_per_rank=32))  # fmt: skip
        return [ids(batches[i : i + accum]) for i in range(0, len(batches), accum)]

    assert steps(4, 2) == steps(2, 4)


def test_an_epoch_stops_at_units_per_rank() -> None:
    batches = list(epoch_micro_batches(windows(10, 10), seed=0, epoch=0, rank=0, micro_batch_size=4, units_per_rank=9))
    assert [len(b) for b in batches] == [4, 4, 1]
