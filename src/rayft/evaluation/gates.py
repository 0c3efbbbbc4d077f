"""Promotion gates: one-line claims about two compared models that the paired tests must support.

A gate reads ``LEFT OP RIGHT [within MARGIN] [on METRIC]``, labels as given to ``rayft compare --model``:

- ``tuned > base``: superiority. The paired test of the metric is significant (p below
  ``eval.significance``) and the difference LEFT - RIGHT is positive.
- ``q4 ~ tuned within 0.02``: equivalence. The TOST at the margin rejects both "LEFT - RIGHT <= -margin"
  and "LEFT - RIGHT >= +margin".
- ``q4 >= tuned within 0.02``: non-inferiority. TOST's one side: "LEFT - RIGHT <= -margin" is rejected,
  so LEFT is shown to be worse by less than the margin, if at all.

The metric defaults to the comparison's primary metric, the margin to ``eval.equivalence_margin``
(in the metric's units). Parsing is strict: anything else is a one-line error that shows the grammar.
Checking is pure: it reads a :class:`~rayft.evaluation.summary.CompareSummary` (``compare.json``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rayft.errors import ConfigError, RayftError, first_line
from rayft.evaluation.stats import PairedTest
from rayft.evaluation.summary import CompareSummary, GateResult

Operator = Literal[">", ">=", "~"]

GRAMMAR = "LEFT > RIGHT | LEFT >= RIGHT [within MARGIN] | LEFT ~ RIGHT [within MARGIN], then optionally 'on METRIC'"

_LABEL = r"[A-Za-z0-9_.\-]+"
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_PATTERN = re.compile(
    rf"^\s*(?P<left>{_LABEL})\s*(?P<op>>=|>|~)\s*(?P<right>{_LABEL})"
    rf"(?:\s+within\s+(?P<margin>{_NUMBER}))?(?:\s+on\s+(?P<metric>{_LABEL}))?\s*$"
)


class GateFailedError(RayftError):
    """A promotion gate is not supported by the comparison's evidence."""


@dataclass(frozen=True)
class Gate:
    """One parsed gate (see the module's grammar); ``margin`` and ``metric`` None mean the defaults."""

    text: str
    left: str
    op: Operator
    right: str
    margin: float | None = None
    metric: str | None = None


def parse_gate(text: str, where: str = "--gate") -> Gate:
    """Parse one gate; a ConfigError naming ``where``, the text and the grammar when it does not parse."""
    match = _PATTERN.match(text)
    if match is None:
        raise ConfigError(
            f"{where} {text!r}: not a gate; write {GRAMMAR}, e.g. 'tuned > base' or 'q4 ~ tuned within 0.02'"
        )
    left, op, right = match["left"], match["op"], match["right"]
    if left == right:
        raise ConfigError(f"{where} {text!r}: compares {left!r} with itself; name two different models")
    margin = float(match["margin"]) if match["margin"] else None
    if op == ">" and margin is not None:
        raise ConfigError(f"{where} {text!r}: '>' takes no margin; use '>=' (non-inferiority) or '~' with 'within'")
    if margin is not None and margin <= 0:
        raise ConfigError(f"{where} {text!r}: the margin must be above 0")
    return Gate(text.strip(), left, op, right, margin, match["metric"])  # type: ignore[arg-type]


def parse_gates(texts: Iterable[str], where: str = "--gate") -> list[Gate]:
    """Parse every gate (the first bad one is the error)."""
    return [parse_gate(text, where) for text in texts]


def check_labels(gates: Sequence[Gate], labels: Iterable[str], where: str = "--gate") -> None:
    """Refuse, before any model loads, a gate naming a model that is not compared."""
    known = list(labels)
    for gate in gates:
        for label in (gate.left, gate.right):
            if label not in known:
                raise ConfigError(
                    f"{where} {gate.text!r}: no model is labelled {label!r}; the labels are {', '.join(known)}"
                )


def gate_margins(gates: Sequence[Gate], default: float) -> list[float]:
    """Every margin the gates need a TOST at, ``default`` first, each once."""
    return list(dict.fromkeys([default, *(g.margin for g in gates if g.op != ">" and g.margin is not None)]))


def check_gate(gate: Gate, summary: CompareSummary, default_margin: float) -> GateResult:
    """Whether ``summary`` supports ``gate``; a GateResult either way. A gate whose evidence the
    comparison does not hold at all (no such pair, metric, or margin) is a ConfigError."""
    metric = gate.metric or summary.primary_metric
    test, sign = _oriented_test(gate, summary, metric)
    diff = sign * test.difference
    low, high = sorted((sign * test.diff_ci_low, sign * test.diff_ci_high))
    facts = f"{gate.left} - {gate.right} {metric} {diff:+.3f} [{low:+.3f}, {high:+.3f}], n={test.n}"
    if test.flips:
        worse, better = ("right_to_wrong", "wrong_to_right") if sign > 0 else ("wrong_to_right", "right_to_wrong")
        facts += f", flips {test.flips[worse]} right-to-wrong / {test.flips[better]} wrong-to-right"
    if gate.op == ">":
        passed = test.significant and diff > 0
        return GateResult(
            gate.text, passed, f"{facts}; {test.test} p={test.p_value:.3g} (needs < {summary.significance:g})"
        )
    margin = gate.margin if gate.margin is not None else default_margin
    tost = test.at_margin(margin)
    if tost is None:
        raise ConfigError(
            f"gate {gate.text!r}: the comparison has no equivalence test at margin {margin:g} for {metric}; "
            "rerun rayft compare with this --gate (or run the pipeline's eval stage again)"
        )
    if gate.op == "~":
        p, claim = tost.p_value, "TOST"
    else:  # ">=": reject "LEFT - RIGHT <= -margin", the lower side when LEFT is the pair's b
        p, claim = (tost.p_lower if sign > 0 else tost.p_upper), "non-inferiority"
    passed = p < summary.significance
    return GateResult(
        gate.text, passed, f"{facts}; {claim} at +-{margin:g} p={p:.3g} (needs < {summary.significance:g})"
    )


def _oriented_test(gate: Gate, summary: CompareSummary, metric: str) -> tuple[PairedTest, int]:
    """The pair's test of ``metric`` and +1 when its difference is LEFT - RIGHT, -1 when RIGHT - LEFT."""
    for pair in summary.pairs:
        if {pair.a, pair.b} != {gate.left, gate.right}:
            continue
        if metric not in pair.tests:
            raise ConfigError(
                f"gate {gate.text!r}: the comparison has no metric {metric!r}; its metrics are {', '.join(pair.tests)}"
            )
        return pair.tests[metric], (1 if pair.b == gate.left else -1)
    labels = ", ".join(summary.models)
    raise ConfigError(
        f"gate {gate.text!r}: the comparison has no pair {gate.left} / {gate.right}; its models are {labels}"
    )


def check_gates(
    gates: Sequence[Gate], summary: CompareSummary, default_margin: float | None = None
) -> list[GateResult]:
    """Every gate checked against ``summary``; a gate without a margin takes ``default_margin``, or the
    comparison's own ``eval.equivalence_margin`` when that is None."""
    margin = default_margin if default_margin is not None else summary_margin(summary)
    return [check_gate(gate, summary, margin) for gate in gates]


def summary_margin(summary: CompareSummary) -> float:
    """The equivalence margin the comparison was run at (its config's ``eval.equivalence_margin``)."""
    value = summary.config.get("eval", {}).get("equivalence_margin")
    if not isinstance(value, int | float):
        raise ConfigError(
            "the comparison does not say its equivalence margin; rerun rayft compare, or give the gate 'within MARGIN'"
        )
    return float(value)


def read_compare_json(path: str | Path, where: str) -> CompareSummary:
    """A compare.json read back, with a one-line error naming ``where`` when it is missing or not one."""
    file = Path(path).expanduser()
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        return CompareSummary.from_dict(data)
    except FileNotFoundError:
        raise ConfigError(f"{where}={path}: no such file; point it at the compare.json rayft compare wrote") from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(
            f"{where}={path}: not a compare.json rayft compare wrote ({type(exc).__name__}: {first_line(exc)})"
        ) from None


def require_passed(results: Sequence[GateResult], what: str) -> None:
    """A one-line GateFailedError for the first failed gate (``what``: what it stops, e.g. 'export')."""
    failed = [r for r in results if not r.passed]
    if failed:
        first = failed[0]
        more = f" ({len(failed) - 1} more gate(s) failed)" if len(failed) > 1 else ""
        raise GateFailedError(f"gate {first.gate!r} failed, {what} stopped: {first.evidence}{more}")
