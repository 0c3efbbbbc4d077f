"""Training methods are units: no objective name is tested outside its method's folder, and the tables that
name methods, losses and advantage estimators agree with the registries that hold them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "rayft"
METHODS = SRC / "training" / "methods"
# `x.objective == "grpo"`, `objective != 'dpo'`, `objective in ("dpo", ...)`, `objective not in (...)`.
COMPARISON = re.compile(r"""objective\s*(==|!=)\s*["']|objective\s+(not\s+)?in\s*[(\[{]""")


def comparisons_outside_methods() -> list[str]:
    """``file:line`` of every objective-name comparison in the source outside a method family's folder."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        inside = path.is_relative_to(METHODS) and path.parent != METHODS  # a family's folder, not the registry's
        if inside:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if COMPARISON.search(line):
                found.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    return found


def test_no_objective_name_is_compared_outside_its_methods_folder() -> None:
    assert comparisons_outside_methods() == []


def test_the_check_sees_a_comparison(tmp_path: Path) -> None:
    # The pattern catches every spelling the loop used to branch with, and leaves the field's own uses alone.
    for line in ('if plan.train.objective == "grpo":', "x = objective != 'dpo'", 'objective in ("dpo", "orpo")',
                 "if cfg.train.objective not in [a]:"):  # fmt: skip
        assert COMPARISON.search(line), line
    for line in ("objective: ObjectiveName = Field(", "method_unit(cfg.train.objective)", "objective = x"):
        assert not COMPARISON.search(line), line


def test_every_configured_objective_has_a_registered_method_and_traits() -> None:
    from rayft.config.objectives import OBJECTIVES, ObjectiveName
    from rayft.training.methods.registry import METHODS as REGISTERED

    assert list(get_args(ObjectiveName)) == list(OBJECTIVES) == list(REGISTERED)


def test_losses_and_advantages_named_by_the_config_are_registered() -> None:
    pytest.importorskip("torch")
    from rayft.config.rl import RlConfig
    from rayft.training.methods.preference.losses import PreferenceObjective
    from rayft.training.methods.preference.method import PAIR_OBJECTIVES
    from rayft.training.methods.rl.losses import BASELINES, POLICY_LOSSES

    fields = RlConfig.model_fields
    assert sorted(get_args(fields["loss"].annotation)) == sorted(POLICY_LOSSES.names())
    assert sorted(get_args(fields["advantage"].annotation)) == sorted(BASELINES.names())
    assert sorted(get_args(PreferenceObjective)) == sorted(PAIR_OBJECTIVES.names())


def test_a_name_outside_a_registry_is_one_line_naming_the_config_path() -> None:
    from rayft.errors import ConfigError
    from rayft.training.methods.unit import Registry

    registry: Registry[int] = Registry("train.rl.loss")
    registry.register("grpo")(1)
    assert registry["grpo"] == 1
    with pytest.raises(ConfigError, match=r"^train.rl.loss='ppo' is not one of grpo; set one of them$"):
        registry["ppo"]
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("grpo")(2)
