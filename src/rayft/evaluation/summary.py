"""Typed summaries of an evaluation and of a comparison: what ``eval.json`` and ``compare.json`` hold.

The JSON files are written from these dataclasses (``to_dict``) and read back into them
(``from_dict``), so every reader (console, Markdown, HTML, the pipeline report) works on fields,
never on string keys. Metric estimates and paired tests are the :mod:`rayft.evaluation.stats`
dataclasses themselves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from rayft.evaluation.stats import Equivalence, Estimate, PairedTest


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``data`` that are fields of the dataclass ``cls`` (others are left out)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class MetricSummary:
    """One metric of one model: its estimate with interval, and whether it is binary or continuous."""

    estimate: Estimate
    kind: str

    @property
    def value(self) -> float:
        """The metric's value."""
        return self.estimate.value

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the estimate's fields plus ``kind``."""
        return self.estimate.to_dict() | {"kind": self.kind}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MetricSummary:
        """Read back :meth:`to_dict`'s form."""
        return cls(Estimate(**_known(Estimate, data)), str(data.get("kind", "continuous")))


@dataclass(frozen=True)
class ModelSummary:
    """What was evaluated (source, checkpoint, fingerprint) and how it did."""

    source: str
    resolved: str
    kind: str
    step: int | None
    metrics: dict[str, MetricSummary]
    primary_metric: str
    training_metrics: dict[str, float] = field(default_factory=dict)
    lineage: dict[str, Any] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    generation_errors: int = 0
    generated_tokens: int = 0
    elapsed_s: float = 0.0
    episodes: dict[str, Any] = field(default_factory=dict)
    """An eval in an environment: the episodes' figures (turns, tool calls, tool errors, truncations)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the layout of ``eval.json``'s model fields and ``compare.json``'s models)."""
        return {
            "source": self.source,
            "resolved": self.resolved,
            "kind": self.kind,
            "step": self.step,
            "training_metrics": self.training_metrics,
            "lineage": self.lineage,
            "fingerprint": self.fingerprint,
            "metrics": {name: m.to_dict() for name, m in self.metrics.items()},
            "primary_metric": self.primary_metric,
            "generation_errors": self.generation_errors,
            "generated_tokens": self.generated_tokens,
            "elapsed_s": self.elapsed_s,
        } | ({"episodes": self.episodes} if self.episodes else {})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSummary:
        """Read back :meth:`to_dict`'s form."""
        values = _known(cls, data)
        values["metrics"] = {name: MetricSummary.from_dict(m) for name, m in data.get("metrics", {}).items()}
        return cls(**values)


@dataclass(frozen=True)
class PairComparison:
    """The paired tests of model ``b`` against model ``a`` (difference = b - a), one per metric."""

    a: str
    b: str
    tests: dict[str, PairedTest]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {"a": self.a, "b": self.b, "tests": {name: t.to_dict() for name, t in self.tests.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], confidence: float = math.nan) -> PairComparison:
        """Read back :meth:`to_dict`'s form (``confidence``: the level of a test that does not say its own)."""
        tests = {name: _paired_test(t, confidence) for name, t in data.get("tests", {}).items()}
        return cls(str(data["a"]), str(data["b"]), tests)


def _paired_test(data: Mapping[str, Any], confidence: float) -> PairedTest:
    """A paired test read back from its JSON form, its equivalence tests as :class:`Equivalence`."""
    values = _known(PairedTest, {"confidence": confidence, **data})
    values["equivalence"] = tuple(Equivalence(**_known(Equivalence, e)) for e in data.get("equivalence", []))
    values["flips"] = dict(data.get("flips", {}))
    return PairedTest(**values)


@dataclass(frozen=True)
class GateResult:
    """A promotion gate (:mod:`rayft.evaluation.gates`) checked against a comparison: whether it
    passed, and its evidence in one line."""

    gate: str
    passed: bool
    evidence: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``compare.json``'s ``gates``)."""
        return {"gate": self.gate, "passed": self.passed, "evidence": self.evidence}


@dataclass(frozen=True)
class EvalSummary:
    """One model's evaluation: what ``eval.json`` holds."""

    task: str
    num_examples: int
    num_fewshot: int
    confidence: float
    model: ModelSummary
    skipped_rows: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the evaluation's settings with the model's fields beside them."""
        head = {"task": self.task, "num_examples": self.num_examples, "num_fewshot": self.num_fewshot}
        tail = {"skipped_rows": self.skipped_rows, "confidence": self.confidence}
        return head | tail | self.model.to_dict() | {"config": self.config}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalSummary:
        """Read back :meth:`to_dict`'s form."""
        values = _known(cls, data)
        values["model"] = ModelSummary.from_dict(data)
        return cls(**values)


@dataclass(frozen=True)
class CompareSummary:
    """Models compared on the same examples: what ``compare.json`` holds."""

    task: str
    num_examples: int
    num_fewshot: int
    confidence: float
    significance: float
    primary_metric: str
    models: dict[str, ModelSummary]
    pairs: list[PairComparison]
    skipped_rows: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    gates: list[GateResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "task": self.task,
            "num_examples": self.num_examples,
            "num_fewshot": self.num_fewshot,
            "skipped_rows": self.skipped_rows,
            "confidence": self.confidence,
            "significance": self.significance,
            "primary_metric": self.primary_metric,
            "models": {label: m.to_dict() for label, m in self.models.items()},
            "pairs": [p.to_dict() for p in self.pairs],
            "gates": [g.to_dict() for g in self.gates],
            "config": self.config,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CompareSummary:
        """Read back :meth:`to_dict`'s form (say, a ``compare.json`` loaded from disk)."""
        values = _known(cls, data)
        values["models"] = {label: ModelSummary.from_dict(m) for label, m in data.get("models", {}).items()}
        level = float(data.get("confidence", math.nan))
        values["pairs"] = [PairComparison.from_dict(p, level) for p in data.get("pairs", [])]
        values["gates"] = [GateResult(**_known(GateResult, g)) for g in data.get("gates", [])]
        return cls(**values)

    def headline_test(self) -> tuple[PairComparison, PairedTest] | None:
        """The first pair's test of the primary metric, if there is one."""
        for pair in self.pairs:
            if self.primary_metric in pair.tests:
                return pair, pair.tests[self.primary_metric]
        return None

    def headline(self) -> str | None:
        """One line on the first pair's primary metric: each value, the difference, its test, the verdict."""
        found = self.headline_test()
        if found is None:
            return None
        pair, test = found
        values = []
        for label in (pair.a, pair.b):
            metric = self.models[label].metrics.get(self.primary_metric) if label in self.models else None
            if metric is not None and math.isfinite(metric.value):
                values.append(f"{label} {metric.value:.3f}")
        verdict = "significant" if test.significant else "not significant"
        level = f"{test.confidence * 100:.4g}% CI " if math.isfinite(test.confidence) else ""
        return (
            f"{self.primary_metric}: {', '.join(values)}; difference {test.difference:+.3f} "
            f"{level}[{test.diff_ci_low:+.3f}, {test.diff_ci_high:+.3f}], {test.test} p={test.p_value:.3g} ({verdict})"
        )
