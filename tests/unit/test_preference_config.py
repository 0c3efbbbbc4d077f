"""The preference objectives are chosen by train.objective; where they cannot apply they are refused with the reason."""

from __future__ import annotations

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError


@pytest.mark.parametrize("objective", ["dpo", "orpo", "simpo"])
def test_a_preference_objective_with_packing_is_refused_with_the_reason(objective: str) -> None:
    with pytest.raises(ConfigError, match=r"packing would join unrelated pairs in one row; set data.packing=false"):
        load_config(None, [f"train.objective={objective}", "data.packing=true"])


def test_preference_settings_load_from_dotted_overrides() -> None:
    config = load_config(None, ["train.objective=simpo", "train.preference.beta=2.0", "train.preference.simpo_gamma=1"])
    assert (config.train.objective, config.train.preference.beta, config.train.preference.simpo_gamma) == (
        "simpo",
        2.0,
        1.0,
    )
    assert load_config(None, []).train.objective == "sft"


def test_an_unknown_objective_is_refused() -> None:
    with pytest.raises(ConfigError, match="train.objective"):
        load_config(None, ["train.objective=kto"])
