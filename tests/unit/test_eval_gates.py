"""Promotion gates: a strict grammar, checks against constructed comparisons, and where they stop things."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rayft.config import RayftConfig
from rayft.errors import ConfigError
from rayft.evaluation import stats
from rayft.evaluation.gates import (
    Gate,
    GateFailedError,
    check_gates,
    check_labels,
    gate_margins,
    parse_gate,
    read_compare_json,
    require_passed,
)
from rayft.evaluation.summary import CompareSummary, PairComparison


@pytest.mark.parametrize(
    ("text", "gate"),
    [
        ("tuned > base", Gate("tuned > base", "tuned", ">", "base")),
        ("  q4 ~ tuned within 0.02 ", Gate("q4 ~ tuned within 0.02", "q4", "~", "tuned", 0.02)),
        ("q4>=tuned within .5 on bleu", Gate("q4>=tuned within .5 on bleu", "q4", ">=", "tuned", 0.5, "bleu")),
        (
            "dpo > sft on accuracy_strict",
            Gate("dpo > sft on accuracy_strict", "dpo", ">", "sft", None, "accuracy_strict"),
        ),
        ("a.1 ~ b-2", Gate("a.1 ~ b-2", "a.1", "~", "b-2")),
    ],
)
def test_gates_parse(text: str, gate: Gate) -> None:
    assert parse_gate(text) == gate


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tuned beats base", "not a gate; write LEFT > RIGHT"),
        ("tuned > base within 0.02", "'>' takes no margin"),
        ("tuned ~ tuned", "compares 'tuned' with itself"),
        ("tuned ~ base within 0", "the margin must be above 0"),
        ("tuned ~ base within -0.1", "not a gate"),
        ("tuned ~ base within 2%", "not a gate"),
        ("tuned < base", "not a gate"),
        ("tuned > base on", "not a gate"),
        ("", "not a gate"),
    ],
)
def test_bad_gates_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="^--gate ") as caught:
        parse_gate(text)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_labels_are_checked_before_anything_runs() -> None:
    gates = [parse_gate("q4 ~ tuned within 0.02")]
    check_labels(gates, ["base", "tuned", "q4"])
    with pytest.raises(ConfigError, match="no model is labelled 'q4'; the labels are base, tuned"):
        check_labels(gates, ["base", "tuned"])


def test_margins_are_the_default_first_then_each_gates_once() -> None:
    gates = [parse_gate(t) for t in ("a > b", "a ~ b within 0.05", "a >= b within 0.05", "a ~ b", "a ~ b within 0.1")]
    assert gate_margins(gates, 0.02) == [0.02, 0.05, 0.1]


def _summary(a: list[float], b: list[float], margins: tuple[float, ...] = (0.02,)) -> CompareSummary:
    """base (a) and tuned (b) compared on one accuracy, as rayft compare would (difference = tuned - base)."""
    test = stats.mcnemar_test(a, b, margins=margins)
    return CompareSummary(
        task="gsm8k",
        num_examples=len(a),
        num_fewshot=0,
        confidence=0.95,
        significance=0.05,
        primary_metric="accuracy",
        models={},
        pairs=[PairComparison("base", "tuned", {"accuracy": test})],
        config={"eval": {"equivalence_margin": margins[0]}},
    )


# 200 examples: base right on 100, tuned on the same 100 and 30 more (30 flips wrong-to-right, none back).
BETTER = _summary([1.0] * 100 + [0.0] * 100, [1.0] * 130 + [0.0] * 70, margins=(0.02, 0.1, 0.2))
# 2000 examples where the two models disagree on 20, 10 each way: same accuracy, few disagreements.
SAME = _summary([1.0] * 1000 + [0.0] * 10 + [1.0] * 10 + [0.0] * 980, [1.0] * 1000 + [1.0] * 10 + [0.0] * 990)


def test_superiority_passes_only_for_the_better_model() -> None:
    passed, backwards = check_gates([parse_gate("tuned > base"), parse_gate("base > tuned")], BETTER)
    assert passed.passed and not backwards.passed
    assert passed.evidence.startswith("tuned - base accuracy +0.150 [")
    assert "flips 0 right-to-wrong / 30 wrong-to-right" in passed.evidence
    # The other orientation reads the same pair: its difference and flips are reversed.
    assert backwards.evidence.startswith("base - tuned accuracy -0.150 [")
    assert "flips 30 right-to-wrong / 0 wrong-to-right" in backwards.evidence
    assert "mcnemar p=" in passed.evidence and "(needs < 0.05)" in passed.evidence
    # Same accuracy: no superiority either way.
    assert not any(r.passed for r in check_gates([parse_gate("tuned > base"), parse_gate("base > tuned")], SAME))


def test_equivalence_and_non_inferiority_read_the_tost() -> None:
    same = SAME.pairs[0].tests["accuracy"].equivalence[0]
    assert same.margin == 0.02 and same.equivalent  # 20 disagreements in 2000: inside +-0.02
    (equivalent,) = check_gates([parse_gate("tuned ~ base")], SAME)  # the comparison's own margin
    assert equivalent.passed and f"TOST at +-0.02 p={same.p_value:.3g}" in equivalent.evidence
    # +0.15 on 200 examples, 30 of them discordant: the difference's standard error is about
    # sqrt(30) / 200 = 0.027, so its 90% interval is about [+0.105, +0.195]: inside +-0.2, not +-0.1.
    texts = ("tuned ~ base within 0.02", "tuned ~ base within 0.1", "tuned ~ base within 0.2",
             "tuned >= base within 0.02", "base >= tuned within 0.1", "base >= tuned within 0.2")  # fmt: skip
    results = check_gates([parse_gate(t) for t in texts], BETTER)
    assert [r.passed for r in results] == [False, False, True, True, False, True]
    test = BETTER.pairs[0].tests["accuracy"]
    low, high = stats.tango_interval(0, 30, 200, 0.10)
    assert low > -0.2 and 0.1 < high < 0.2  # inside (-0.2, 0.2), not inside (-0.1, 0.1): as the gates found
    # "tuned >= base" rejects tuned - base <= -margin: the pair's lower side; "base >= tuned" the upper.
    tost = test.at_margin(0.02)
    assert tost is not None and f"non-inferiority at +-0.02 p={tost.p_lower:.3g}" in results[3].evidence
    tost = test.at_margin(0.1)
    assert tost is not None and f"non-inferiority at +-0.1 p={tost.p_upper:.3g}" in results[4].evidence


def test_missing_evidence_is_a_one_line_error() -> None:
    for text, message in [
        ("tuned ~ base within 0.05", "no equivalence test at margin 0.05 for accuracy; rerun rayft compare"),
        ("tuned > base on bleu", "no metric 'bleu'; its metrics are accuracy"),
        ("q4 > base", "no pair q4 / base"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_gates([parse_gate(text)], BETTER)


def test_a_failed_gate_is_one_line_naming_the_evidence() -> None:
    results = check_gates([parse_gate("tuned > base"), parse_gate("base > tuned"), parse_gate("tuned ~ base")], BETTER)
    with pytest.raises(GateFailedError) as caught:
        require_passed(results, "export")
    message = str(caught.value)
    assert message.startswith("gate 'base > tuned' failed, export stopped: base - tuned accuracy -0.150")
    assert message.endswith("(1 more gate(s) failed)") and "\n" not in message
    require_passed(results[:1], "export")


def test_gate_results_round_trip_through_compare_json(tmp_path: Path) -> None:
    import dataclasses

    summary = dataclasses.replace(BETTER, gates=check_gates([parse_gate("tuned > base")], BETTER))
    path = tmp_path / "compare.json"
    path.write_text(json.dumps(summary.to_dict()))
    assert read_compare_json(path, "export.gate_report") == summary
    with pytest.raises(ConfigError, match="export.gate_report=.*: no such file"):
        read_compare_json(tmp_path / "nope.json", "export.gate_report")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a compare.json rayft compare wrote"):
        read_compare_json(tmp_path / "bad.json", "export.gate_report")


def test_rayft_export_checks_its_gates_before_anything_loads(tmp_path: Path) -> None:
    from rayft.recipes.export import passed_gates

    report = tmp_path / "compare.json"
    report.write_text(json.dumps(BETTER.to_dict()))
    cfg = RayftConfig.model_validate({"export": {"gate": ["base > tuned"], "gate_report": str(report)}})
    with pytest.raises(GateFailedError, match="^gate 'base > tuned' failed, export stopped: "):
        passed_gates(cfg, None)
    cfg = RayftConfig.model_validate({"export": {"gate": ["tuned > base"]}})
    with pytest.raises(ConfigError, match="set export.gate_report=PATH/compare.json"):
        passed_gates(cfg, None)
    (result,) = passed_gates(cfg, BETTER)
    assert result.passed and result.gate == "tuned > base"
    bad = RayftConfig.model_validate({"export": {"gate": ["tuned beats base"]}})
    with pytest.raises(ConfigError, match="^export.gate 'tuned beats base': not a gate"):
        passed_gates(bad, BETTER)


def test_the_pipeline_refuses_a_gate_it_cannot_check_before_it_starts() -> None:
    from rayft.pipeline.runner import check_export_gates

    cfg = RayftConfig.model_validate({"export": {"gate": ["tuned > base"]}})
    check_export_gates(cfg, ["train", "eval", "export"])
    with pytest.raises(ConfigError, match="the config has no eval stage; add an `eval:` section"):
        check_export_gates(cfg, ["train", "export"])
    sft = RayftConfig.model_validate({"export": {"gate": ["dpo > sft"]}})
    with pytest.raises(ConfigError, match="no model is labelled 'dpo'; the labels are base, tuned"):
        check_export_gates(sft, ["train", "eval", "export"])
    check_export_gates(sft, ["train", "pairs", "preference", "eval", "export"])


def test_compare_cli_refuses_a_bad_gate_in_one_line(tmp_path: Path) -> None:
    from rayft.cli.main import cli

    result = CliRunner().invoke(
        cli, ["compare", str(tmp_path / "missing.yaml"), "--model", "a=x", "--model", "b=y", "--gate", "a >> b"]
    )
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "Error: --gate 'a >> b': not a gate; write "
        "LEFT > RIGHT | LEFT >= RIGHT [within MARGIN] | LEFT ~ RIGHT [within MARGIN], then optionally 'on METRIC', "
        "e.g. 'tuned > base' or 'q4 ~ tuned within 0.02'"
    ]
