"""Checking GSM8K-style answers: calculator annotations re-computed exactly, one final ``#### N`` line.

The same checks judge every math row, whichever generator wrote it (symbolic variations or an LLM
teacher), so an accepted row is verified independently of the code that produced it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

ANNOTATION = re.compile(r"<<([^<>]*)>>")
FINAL_LINE = re.compile(r"^\s*####(.*)$", re.MULTILINE)
EXPR_TOKEN = re.compile(r"\d+(?:\.\d+)?|\.\d+|[-+*/()]")
Number = int | Fraction
"""An exact value: int when integral, else Fraction."""
NUMBER_TEXT = re.compile(r"^[-+]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?$")


@dataclass(frozen=True)
class Annotation:
    """One ``<<expr=result>>`` annotation: its expression tokens and the result it states."""

    tokens: tuple[str, ...]
    result: Fraction
    start: int
    end: int


class AnswerError(ValueError):
    """An answer fails a check; ``reason`` is a short stable code counted in the SDG summary."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def parse_number(text: str) -> Fraction:
    """A number as written in GSM8K text (``1,200``, ``$3.50``, ``.5``, ``-4``), exactly."""
    cleaned = text.strip()
    if not cleaned or not NUMBER_TEXT.match(cleaned) or not any(c.isdigit() for c in cleaned):
        raise ValueError(f"not a number: {text!r}")
    return Fraction(cleaned.replace("$", "").replace(",", ""))


def tokenize(expr: str) -> tuple[str, ...]:
    """Split an annotation expression into numbers and operators; anything else is an error."""
    compact = "".join(expr.split())
    tokens = tuple(EXPR_TOKEN.findall(compact))
    if "".join(tokens) != compact or not tokens:
        raise ValueError(f"unsupported characters in expression {expr!r}")
    return tokens


def evaluate(tokens: tuple[str, ...] | list[str]) -> Fraction:
    """Evaluate + - * / and parentheses over exact fractions (recursive descent, no eval())."""
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError("expression ends early")
        pos += 1
        return tokens[pos - 1]

    def atom() -> Fraction:
        tok = take()
        if tok == "(":
            value = expression()
            if take() != ")":
                raise ValueError("unbalanced parentheses")
            return value
        if tok == "-":
            return -atom()
        if tok == "+":
            return atom()
        if tok[0].isdigit() or tok[0] == ".":
            return Fraction(tok)
        raise ValueError(f"unexpected {tok!r}")

    def term() -> Fraction:
        value = atom()
        while peek() in ("*", "/"):
            if take() == "*":
                value *= atom()
            else:
                divisor = atom()
                if divisor == 0:
                    raise ValueError("division by zero")
                value /= divisor
        return value

    def expression() -> Fraction:
        value = term()
        while peek() in ("+", "-"):
            value = value + term() if take() == "+" else value - term()
        return value

    result = expression()
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r}")
    return result


def parse_annotations(answer: str) -> list[Annotation]:
    """Every annotation of an answer, checked: it has ``=``, parses, and its result is right."""
    found = []
    for match in ANNOTATION.finditer(answer):
        body = match.group(1)
        if "=" not in body:
            raise AnswerError("annotation_without_equals", f"<<{body}>>")
        expr, _, stated = body.rpartition("=")
        try:
            tokens = tokenize(expr)
            value = evaluate(tokens)
            result = parse_number(stated)
        except (ValueError, ZeroDivisionError) as exc:
            raise AnswerError("annotation_unparsable", f"<<{body}>>: {exc}") from None
        if value != result:
            raise AnswerError("annotation_wrong", f"<<{body}>> computes {format_number(value)}")
        found.append(Annotation(tokens, result, match.start(), match.end()))
    return found


def final_answer(answer: str) -> Fraction:
    """The value of the single final ``#### N`` line, which must be the last line."""
    finals = FINAL_LINE.findall(answer)
    if len(finals) != 1:
        raise AnswerError("final_line_count", f"{len(finals)} '####' lines, expected exactly 1")
    lines = [line for line in answer.strip().splitlines() if line.strip()]
    if not lines or not lines[-1].lstrip().startswith("####"):
        raise AnswerError("final_not_last", "the '#### N' line is not the last line")
    try:
        return parse_number(finals[0])
    except ValueError:
        raise AnswerError("final_not_number", f"'####{finals[0]}'") from None


def check_math_answer(answer: str) -> str | None:
    """Why a GSM8K-style answer fails verification (a reason code), or None when it passes.

    Passing means: exactly one ``#### N`` line, last; at least one annotation; every annotation
    re-computes to the result it states; and N equals the result of the last annotation.
    """
    try:
        final = final_answer(answer)
        steps = parse_annotations(answer)
    except AnswerError as exc:
        return exc.reason
    if not steps:
        return "no_annotations"
    if steps[-1].result != final:
        return "final_mismatch"
    return None


def decimal_places(value: Number) -> int | None:
    """Digits after the point needed to write ``value`` exactly; None when it never terminates."""
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    return max(twos, fives) if den == 1 else None


def format_number(value: Number, *, places: int | None = None, commas: bool = False) -> str:
    """Write ``value`` as GSM8K does: integers plainly, decimals with the fewest (or ``places``) digits."""
    needed = decimal_places(value)
    if needed is None:
        needed = 6
    digits = max(needed, places or 0)
    if digits == 0:
        return f"{value.numerator:,}" if commas else str(value.numerator)
    scaled = round(value * 10**digits)
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled), 10**digits)
    head = f"{whole:,}" if commas else str(whole)
    return f"{sign}{head}.{frac:0{digits}d}"
