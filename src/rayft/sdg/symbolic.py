"""Symbolic variations of GSM8K-style problems: new numbers, the same reasoning, a verified answer.

A seed's solution is a chain of calculator annotations (``<<48/2=24>>``). :func:`analyze_seed`
reads that chain once: which literals are numbers of the question (the inputs), which are results
of earlier steps, and which are constants (60 minutes, "half"). :func:`make_variation` then draws
new inputs near the seed's values, re-executes the chain exactly, keeps only draws where every
result keeps the seed's kind (a non-negative integer stays one, so divisions stay exact), and
rewrites the question and the answer text through one old-value to new-value map. A draw in which
one old value would need two new values (the text would become ambiguous) is discarded.

Seeds the method cannot vary safely raise :class:`UnusableSeedError` with a counted reason.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rayft.sdg.mathcheck import (
    ANNOTATION,
    AnswerError,
    Number,
    check_math_answer,
    decimal_places,
    format_number,
    parse_annotations,
    parse_number,
)

# Numbers as written in prose: 1,200 / 3.5 / .5 / 48. A trailing sentence period is not a decimal point.
TEXT_NUMBER = re.compile(r"(?<![\d.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d)|(?<![\d.])\.\d+")

# A question number is kept fixed when the question also says it in words: "half" of 10 is /2
# even where the question mentions 2 dogs elsewhere.
IMPLIED_BY_WORDS: dict[int, tuple[str, ...]] = {
    2: ("half", "twice", "double", "two", "pair", "halves"),
    3: ("third", "triple", "thrice", "three"),
    4: ("quarter", "four"),
    7: ("week",),
    10: ("ten",),
    12: ("dozen", "month", "year"),
    24: ("day",),
    60: ("hour", "minute"),
    100: ("percent", "%", "cent", "hundred"),
}
MIN_VARIED_VALUE = 2  # 0 and 1 are structural ("one more"); they never vary.
YEAR_RANGE = (1900, 2100)


class UnusableSeedError(ValueError):
    """A seed that cannot be varied safely; ``reason`` is a stable code counted in the summary."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Literal:
    """One number in an annotation: an input of the question, an earlier result, or a constant."""

    kind: str  # "input" | "result" | "const"
    value: Number
    ref: int = -1  # the step whose result this is (kind "result")


Node = Literal | tuple[Any, ...]
"""An expression tree: a Literal leaf, ("neg", node), or (operator, left, right)."""


@dataclass(frozen=True)
class Step:
    """One annotation: its tokens with literals resolved, its compiled tree, and the seed's result."""

    tokens: tuple[str | Literal, ...]
    tree: Node
    result: Number


@dataclass(frozen=True)
class SeedChain:
    """What :func:`make_variation` needs from a seed, computed once by :func:`analyze_seed`."""

    question: str
    answer: str
    steps: tuple[Step, ...]
    inputs: tuple[Number, ...]  # question values that vary
    input_places: dict[Number, int]  # decimals the question writes each input with
    fixed: frozenset[Number]  # values that keep their value: constants, unused question numbers


def analyze_seed(question: str, answer: str) -> SeedChain:
    """Resolve the annotation chain of a verified seed; raises UnusableSeedError when it cannot be varied."""
    reason = check_math_answer(answer)
    if reason is not None:
        raise UnusableSeedError(f"seed_{reason}")
    try:
        annotations = parse_annotations(answer)
    except AnswerError as exc:  # pragma: no cover - check_math_answer ran the same checks
        raise UnusableSeedError(f"seed_{exc.reason}") from None
    question_values = {_norm(parse_number(m.group())): m.group() for m in TEXT_NUMBER.finditer(question)}
    variable = {v for v in question_values if _may_vary(v, question)}
    steps: list[Step] = []
    used_inputs: set[Number] = set()
    constants: set[Number] = set()
    for ann in annotations:
        resolved: list[str | Literal] = []
        for tok in ann.tokens:
            if not (tok[0].isdigit() or tok[0] == "."):
                resolved.append(tok)
                continue
            lit = _resolve_literal(_norm(Fraction(tok)), steps, variable)
            if lit.kind == "input":
                used_inputs.add(lit.value)
            elif lit.kind == "const":
                constants.add(lit.value)
            resolved.append(lit)
        steps.append(Step(tuple(resolved), _compile(resolved), _norm(ann.result)))
    if not used_inputs:
        raise UnusableSeedError("no_variable_numbers", "no number of the question is used by the annotations")
    fixed = frozenset(constants | (set(question_values) - used_inputs))
    places = {v: _places_written(question_values[v]) for v in used_inputs}
    chain = SeedChain(question, answer, tuple(steps), tuple(sorted(used_inputs)), places, fixed)
    _check_text_numbers(chain)
    return chain


def _may_vary(value: Number, question: str) -> bool:
    if value < MIN_VARIED_VALUE or (value.denominator == 1 and YEAR_RANGE[0] <= value <= YEAR_RANGE[1]):
        return False
    words = IMPLIED_BY_WORDS.get(int(value), ()) if value.denominator == 1 else ()
    lowered = question.lower()
    return not any(w in lowered for w in words)


def _resolve_literal(value: Number, steps: list[Step], variable: set[Number]) -> Literal:
    # The latest earlier result wins: chains reuse what they just computed.
    for index in range(len(steps) - 1, -1, -1):
        if steps[index].result == value:
            return Literal("result", value, index)
    return Literal("input" if value in variable else "const", value)


def _places_written(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


def _check_text_numbers(chain: SeedChain) -> None:
    """Every number the solution prose mentions must be one the chain knows how to rewrite."""
    known = set(chain.inputs) | chain.fixed | {s.result for s in chain.steps}
    for match in TEXT_NUMBER.finditer(_prose(chain.answer)):
        if parse_number(match.group()) not in known:
            raise UnusableSeedError("unannotated_number", f"{match.group()} in the solution comes from no annotation")


def _prose(answer: str) -> str:
    """The answer without annotations and without the final line (both are rebuilt separately)."""
    body = answer[: answer.rfind("####")]
    return ANNOTATION.sub(" ", body)


def make_variation(
    chain: SeedChain, rng: random.Random, max_attempts: int = 50, scale: Number = 1
) -> tuple[str, str] | None:
    """A new (question, answer) with other numbers and a re-computed chain, or None after max_attempts.
    ``scale`` multiplies each input before the draw near it (large operands for calculator traces; a fraction
    such as 1/10 for smaller ones, never below 2)."""
    for _ in range(max_attempts):
        new_inputs = {v: _draw_near(_norm(v * scale), chain.input_places[v], rng) for v in chain.inputs}
        if all(new_inputs[v] == v for v in chain.inputs):
            continue
        mapping = _execute(chain, new_inputs)
        if mapping is not None:
            return _rewrite(chain.question, mapping), _rewrite_answer(chain, mapping)
    return None


def _draw_near(value: Number, places: int, rng: random.Random) -> Number:
    """A value in [value/2, 2*value] written with the same number of decimals (the seed's range)."""
    if places == 0 and isinstance(value, int):
        low = max(MIN_VARIED_VALUE, (value + 1) // 2)
        return rng.randint(low, max(low + 1, 2 * value))
    scale = 10**places
    low = max(MIN_VARIED_VALUE * scale, math.ceil(value * scale / 2))
    high = max(low + 1, math.floor(value * scale * 2))
    return _norm(Fraction(rng.randint(low, high), scale))


def _execute(chain: SeedChain, new_inputs: dict[Number, Number]) -> dict[Number, Number] | None:
    """Re-run the chain; the old-to-new value map, or None when a result changes kind or a value clashes."""
    mapping: dict[Number, Number] = dict(new_inputs)
    for value in chain.fixed:
        if mapping.setdefault(value, value) != value:
            return None
    results: list[Number] = []
    for step in chain.steps:
        try:
            new = _evaluate(step.tree, new_inputs, results)
        except ZeroDivisionError:
            return None
        if not _same_kind(step.result, new) or mapping.setdefault(step.result, new) != new:
            return None
        results.append(new)
    return mapping


def _compile(tokens: list[str | Literal]) -> Node:
    """The expression tree of resolved annotation tokens (the grammar of mathcheck.evaluate)."""
    pos = 0

    def take() -> str | Literal:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def peek() -> str | Literal | None:
        return tokens[pos] if pos < len(tokens) else None

    def atom() -> Node:
        tok = take()
        if isinstance(tok, Literal):
            return tok
        if tok == "(":
            node = expression()
            take()
            return node
        return ("neg", atom()) if tok == "-" else atom()

    def term() -> Node:
        node = atom()
        while peek() in ("*", "/"):
            node = (take(), node, atom())
        return node

    def expression() -> Node:
        node = term()
        while peek() in ("+", "-"):
            node = (take(), node, term())
        return node

    return expression()


def _evaluate(node: Node, new_inputs: dict[Number, Number], results: list[Number]) -> Number:
    if isinstance(node, Literal):
        if node.kind == "input":
            return new_inputs[node.value]
        return results[node.ref] if node.kind == "result" else node.value
    if node[0] == "neg":
        return -_evaluate(node[1], new_inputs, results)
    op, left, right = node
    a, b = _evaluate(left, new_inputs, results), _evaluate(right, new_inputs, results)
    if op != "/":
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return value if isinstance(value, int) else _norm(value)
    if b == 0:
        raise ZeroDivisionError
    if isinstance(a, int) and isinstance(b, int):
        quotient, rest = divmod(a, b)
        return quotient if rest == 0 else Fraction(a, b)
    return _norm(Fraction(a) / b)


def _norm(value: Number) -> Number:
    """Integers as int, everything else as Fraction."""
    return int(value) if isinstance(value, Fraction) and value.denominator == 1 else value


def _same_kind(old: Number, new: Number) -> bool:
    """Integers stay integers, non-negative stays non-negative, zero-free stays zero-free, decimals stay short."""
    if old >= 0 > new or (old != 0 and new == 0):
        return False
    if old.denominator == 1:
        return new.denominator == 1
    places = decimal_places(new)
    return places is not None and places <= max(2, decimal_places(old) or 0)


def _rewrite(text: str, mapping: dict[Number, Number]) -> str:
    def swap(match: re.Match[str]) -> str:
        old_text = match.group()
        new = mapping.get(parse_number(old_text))
        if new is None:
            return old_text
        return format_number(new, places=_places_written(old_text), commas="," in old_text)

    return TEXT_NUMBER.sub(swap, text)


def _rewrite_answer(chain: SeedChain, mapping: dict[Number, Number]) -> str:
    """The seed's solution with its prose rewritten and every annotation rebuilt from the new chain."""
    pieces: list[str] = []
    cursor = 0
    body = chain.answer[: chain.answer.rfind("####")]
    for step, match in zip(chain.steps, ANNOTATION.finditer(body), strict=True):
        pieces.append(_rewrite(body[cursor : match.start()], mapping))
        expr = "".join(_new_token(t, mapping) for t in step.tokens)
        pieces.append(f"<<{expr}={format_number(mapping[step.result])}>>")
        cursor = match.end()
    pieces.append(_rewrite(body[cursor:], mapping))
    final = mapping[chain.steps[-1].result]
    return "".join(pieces).rstrip() + f"\n#### {format_number(final)}"


def _new_token(token: str | Literal, mapping: dict[Number, Number]) -> str:
    if isinstance(token, str):
        return token
    return format_number(mapping[token.value])
