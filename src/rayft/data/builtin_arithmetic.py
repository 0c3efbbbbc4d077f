"""A built-in set of arithmetic word problems, generated offline from rayft's own templates.

Rows look like GSM8K's: a ``question`` and an ``answer`` whose steps carry calculator
annotations (``<<12*3=36>>``) and whose last line is ``#### N``. The set is deterministic for a
seed, so the quickstart, the tests and the symbolic SDG seeds need no download.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

NAMES = ("Maya", "Omar", "Lena", "Tariq", "Ines", "Kofi", "Hana", "Diego", "Priya", "Jonas", "Amara", "Felix")
ITEMS = ("marbles", "stickers", "pencils", "shells", "stamps", "cookies", "cards", "beads")
PLACES = ("market", "library", "school fair", "bakery", "garden shop")
T = TypeVar("T")


@dataclass(frozen=True)
class _Problem:
    question: str
    steps: tuple[str, ...]
    result: int


def _step(text_before: str, a: int, op: str, b: int, result: int, text_after: str = "") -> str:  # noqa: PLR0917
    return f"{text_before}{a}{op}{b} = <<{a}{op}{b}={result}>>{result}{text_after}"


def _buy_and_give(rng: random.Random) -> _Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    boxes, per_box, given = rng.randint(2, 9), rng.randint(3, 15), rng.randint(1, 12)
    total = boxes * per_box
    left = total - given
    question = (
        f"{name} buys {boxes} boxes of {item} with {per_box} {item} in each box. "
        f"{name} gives {given} {item} to a friend. How many {item} does {name} have left?"
    )
    steps = (
        _step(f"{name} buys ", boxes, "*", per_box, total, f" {item}."),
        _step(f"After giving some away, {name} has ", total, "-", given, left, f" {item}."),
    )
    return _Problem(question, steps, left)


def _earn_and_spend(rng: random.Random) -> _Problem:
    name, place = rng.choice(NAMES), rng.choice(PLACES)
    hours, rate, spent = rng.randint(2, 10), rng.randint(5, 20), rng.randint(1, 30)
    earned = hours * rate
    left = earned - spent
    question = (
        f"{name} works {hours} hours at the {place} and earns ${rate} per hour. "
        f"Then {name} spends ${spent} on lunch. How many dollars does {name} have now?"
    )
    steps = (
        _step(f"{name} earns ", hours, "*", rate, earned, " dollars."),
        _step(f"After lunch, {name} has ", earned, "-", spent, left, " dollars."),
    )
    return _Problem(question, steps, left)


def _share_equally(rng: random.Random) -> _Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    friends, each, extra = rng.randint(2, 8), rng.randint(2, 12), rng.randint(1, 20)
    total = friends * each
    grand = total + extra
    question = (
        f"{name} shares {item} equally among {friends} friends so that each friend gets {each}. "
        f"{name} also keeps {extra} {item}. How many {item} did {name} have at the start?"
    )
    steps = (
        _step("The friends get ", friends, "*", each, total, f" {item} in all."),
        _step("At the start there were ", total, "+", extra, grand, f" {item}."),
    )
    return _Problem(question, steps, grand)


def _half_then_more(rng: random.Random) -> _Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    first = 2 * rng.randint(3, 40)
    second = first // 2
    bought = rng.randint(1, 25)
    total = first + second
    final = total + bought
    question = (
        f"{name} collects {first} {item} in the first week and half as many in the second week. "
        f"Then {name} buys {bought} more. How many {item} does {name} have in total?"
    )
    steps = (
        _step("In the second week there are ", first, "/", 2, second, f" {item}."),
        _step("Over both weeks that is ", first, "+", second, total, f" {item}."),
        _step("With the bought ones, the total is ", total, "+", bought, final, f" {item}."),
    )
    return _Problem(question, steps, final)


GENERATORS: tuple[Callable[[random.Random], _Problem], ...] = (
    _buy_and_give,
    _earn_and_spend,
    _share_equally,
    _half_then_more,
)


def iter_arithmetic_problems(num_rows: int, seed: int = 0) -> Iterator[dict[str, str]]:
    """Yield ``num_rows`` distinct problems as ``{"question", "answer"}`` rows, GSM8K-style."""
    problems = distinct_examples(lambda rng: rng.choice(GENERATORS)(rng), _question, num_rows, seed, "problems")
    for problem in problems:
        answer = "\n".join((*problem.steps, f"#### {problem.result}"))
        yield {"question": problem.question, "answer": answer}


def _question(problem: _Problem) -> str:
    return problem.question


def distinct_examples(
    make: Callable[[random.Random], T], key: Callable[[T], str], num_rows: int, seed: int, what: str
) -> Iterator[T]:
    """Yield ``num_rows`` results of ``make`` with distinct ``key``s, deterministic for ``seed``; a
    generator that keeps repeating itself (50 tries per row) is an error naming ``what``."""
    rng = random.Random(seed)
    seen: set[str] = set()
    for _ in range(num_rows * 50):
        if len(seen) == num_rows:
            return
        item = make(rng)
        if key(item) not in seen:
            seen.add(key(item))
            yield item
    if len(seen) < num_rows:
        raise ValueError(f"cannot generate {num_rows} distinct {what}; ask for fewer rows")
