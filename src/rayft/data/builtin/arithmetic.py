"""A built-in set of arithmetic word problems, generated offline from rayft's own templates.

Rows look like GSM8K's: a ``question`` and an ``answer`` whose steps carry calculator
annotations (``<<12*3=36>>``) and whose last line is ``#### N``. The set is deterministic for a
seed, so the quickstart, the tests and the symbolic SDG seeds need no download.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml

_WORDS = yaml.safe_load(Path(__file__).with_name("arithmetic.yaml").read_text(encoding="utf-8"))
NAMES: tuple[str, ...] = tuple(_WORDS["names"])
ITEMS: tuple[str, ...] = tuple(_WORDS["items"])
PLACES: tuple[str, ...] = tuple(_WORDS["places"])
T = TypeVar("T")


@dataclass(frozen=True)
class _Problem:
    question: str
    steps: tuple[str, ...]
    result: int


def _step(text_before: str, a: int, op: str, b: int, result: int, text_after: str = "") -> str:  # noqa: PLR0917
    return f"{text_before}{a}{op}{b} = <<{a}{op}{b}={result}>>{result}{text_after}"


@dataclass(frozen=True)
class _Story:
    """The words of an ``a*b - c`` problem (so many groups of so many, less what is given or spent) and
    the ranges of its numbers. Text fields are ``str.format`` templates of ``name``, ``thing``, ``a``,
    ``b`` and ``c``; each step is the text before its calculation and the text after it."""

    things: tuple[str, ...]
    ranges: tuple[tuple[int, int], ...]  # those of a, b and c
    question: str
    steps: tuple[tuple[str, str], ...]  # the product's step, then the difference's


_STORIES = tuple(
    _Story(
        tuple(_WORDS[story["things"]]),
        tuple((low, high) for low, high in story["ranges"]),
        story["question"],
        tuple((before, after) for before, after in story["steps"]),
    )
    for story in _WORDS["multiply_then_subtract"]
)
"""The ``a*b - c`` problems: data, in ``arithmetic.yaml`` (as are the names, items and places)."""


def _multiply_then_subtract(story: _Story, rng: random.Random) -> _Problem:
    name, thing = rng.choice(NAMES), rng.choice(story.things)
    a, b, c = (rng.randint(low, high) for low, high in story.ranges)
    words = {"name": name, "thing": thing, "a": a, "b": b, "c": c}
    (before_1, after_1), (before_2, after_2) = (
        (before.format(**words), after.format(**words)) for before, after in story.steps
    )
    steps = (_step(before_1, a, "*", b, a * b, after_1), _step(before_2, a * b, "-", c, a * b - c, after_2))
    return _Problem(story.question.format(**words), steps, a * b - c)


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
    *(functools.partial(_multiply_then_subtract, story) for story in _STORIES),
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
