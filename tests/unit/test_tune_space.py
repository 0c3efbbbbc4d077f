"""The tune: section and its search space: shapes, dotted paths, value types, and Ray's domains."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.config import RayftConfig, dump_config, load_config
from rayft.config.tune import TuneConfig
from rayft.errors import ConfigError
from rayft.tuning.space import apply_params, check_search_space, count_trials, to_ray_mutations, to_ray_space


def tuned(tmp_path: Path, tune_yaml: str) -> RayftConfig:
    path = tmp_path / "cfg.yaml"
    path.write_text("name: sweepme\ntrain:\n  max_steps: 4\ntune:\n" + tune_yaml)
    return load_config(path)


def test_yaml_section_round_trips_through_dump(tmp_path: Path) -> None:
    cfg = tuned(
        tmp_path,
        "  scheduler: asha\n  search_space:\n"
        "    train.learning_rate: {loguniform: [1e-5, 1e-3]}\n"  # YAML reads 1e-5 as a string
        "    lora.r: {choice: [8, 16, 32]}\n",
    )
    assert cfg.tune is not None
    assert cfg.tune.search_space["train.learning_rate"].values == (1e-5, 1e-3)
    assert cfg.tune.sweep_name(cfg.name) == "sweepme-tune"
    again = tmp_path / "again.yaml"
    again.write_text(dump_config(cfg))
    assert load_config(again) == cfg


@pytest.mark.parametrize(
    ("domain", "match"),
    [
        ("{loguniform: [0, 1]}", r"loguniform needs positive bounds, got \[0, 1\]"),
        ("{uniform: [1, 0.5]}", "needs low < high"),
        ("{randint: [1]}", r"needs two numbers \[low, high\]"),
        ("{choice: []}", "choice needs a non-empty list"),
        ("{normal: [0, 1]}", "kind"),
        ("{uniform: [0, 1], choice: [1]}", "exactly one key"),
    ],
)
def test_malformed_domains_are_config_errors(tmp_path: Path, domain: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        tuned(tmp_path, f"  search_space:\n    train.weight_decay: {domain}\n")


def test_search_algorithm_combinations() -> None:
    lr = {"loguniform": [1e-5, 1e-3]}
    with pytest.raises(ValueError, match=r"grid needs finite values, but train.learning_rate are ranges"):
        TuneConfig(search_algorithm="grid", search_space={"train.learning_rate": lr})
    with pytest.raises(ValueError, match="optuna cannot run grid domains"):
        TuneConfig(search_algorithm="optuna", search_space={"lora.r": {"grid": [4, 8]}})
    with pytest.raises(ValueError, match="pbt .* cannot run with search_algorithm optuna"):
        TuneConfig(scheduler="pbt", search_algorithm="optuna", search_space={"train.learning_rate": lr})
    with pytest.raises(ValueError, match="search_space is empty"):
        TuneConfig()
    grid = TuneConfig(search_algorithm="grid", search_space={"lora.r": {"grid": [4, 8]}, "seed": {"choice": [1, 2]}})
    assert grid.num_samples == 1 and count_trials(grid) == 4
    mixed = TuneConfig(num_samples=3, search_space={"lora.r": {"grid": [4, 8]}, "train.learning_rate": lr})
    assert count_trials(mixed) == 6


def test_unknown_path_gets_a_suggestion() -> None:
    cfg = RayftConfig(tune={"search_space": {"train.lerning_rate": {"loguniform": [1e-5, 1e-3]}}})
    with pytest.raises(ConfigError, match=r"'train.lerning_rate' is no config field.*did you mean train.learning_rate"):
        check_search_space(cfg)


def test_wrong_value_type_names_path_value_and_fix() -> None:
    cfg = RayftConfig(
        tune={
            "search_space": {
                "lora.r": {"uniform": [4, 64]},
                "train.fused_loss": {"choice": ["chunked", "fast"]},
                "name": {"choice": ["a", "b"]},
            }
        }
    )
    with pytest.raises(ConfigError) as caught:
        check_search_space(cfg)
    text = str(caught.value)
    assert "3 problem(s)" in text
    assert "tune.search_space['lora.r']: the uniform value 26.2 is invalid" in text
    assert "use randint: [4, 65]" in text
    assert "the choice value 'fast' is invalid there: train.fused_loss = 'fast'" in text
    assert "'name' cannot be tuned" in text


def test_valid_space_passes_and_apply_sets_values() -> None:
    cfg = RayftConfig(
        tune={
            "search_space": {
                "train.learning_rate": {"loguniform": [1e-5, 1e-3]},
                "lora.r": {"choice": [8, 16]},
                "train.warmup_steps": {"randint": [0, 5]},
                "data.datasets.0.max_rows": {"grid": [10, 20]},
            }
        }
    )
    check_search_space(cfg)
    trial = apply_params(cfg, {"train.learning_rate": 3e-4, "lora.r": 16, "data.datasets.0.max_rows": 20})
    assert (trial.train.learning_rate, trial.lora.r, trial.data.datasets[0].max_rows) == (3e-4, 16, 20)
    assert cfg.lora.r != 16 or cfg.train.learning_rate != 3e-4  # the original is untouched


def test_pbt_mutations_are_checked_too() -> None:
    cfg = RayftConfig(
        tune={
            "scheduler": "pbt",
            "search_space": {"train.learning_rate": {"loguniform": [1e-5, 1e-3]}},
            "pbt": {"hyperparam_mutations": {"train.weight_decay": {"uniform": [-1, 0.1]}}},
        }
    )
    with pytest.raises(
        ConfigError, match=r"tune.pbt.hyperparam_mutations\['train.weight_decay'\]: the uniform value -1"
    ):
        check_search_space(cfg)


def test_ray_domains() -> None:
    from ray import tune

    space = TuneConfig(
        search_space={
            "train.learning_rate": {"loguniform": [1e-5, 1e-3]},
            "lora.r": {"choice": [8, 16]},
            "train.warmup_steps": {"randint": [0, 5]},
            "seed": {"grid": [1, 2]},
        }
    )
    ray_space = to_ray_space(space)
    assert isinstance(ray_space["train.learning_rate"], tune.search.sample.Float)
    assert ray_space["lora.r"].categories == [8, 16]
    assert (ray_space["train.warmup_steps"].lower, ray_space["train.warmup_steps"].upper) == (0, 5)
    assert ray_space["seed"] == {"grid_search": [1, 2]}
    grid = TuneConfig(search_algorithm="grid", search_space={"lora.r": {"choice": [8, 16]}})
    assert to_ray_space(grid)["lora.r"] == {"grid_search": [8, 16]}
    pbt = TuneConfig(
        scheduler="pbt", search_space={"lora.r": {"choice": [8, 16]}, "train.learning_rate": {"uniform": [0.1, 0.2]}}
    )
    mutations = to_ray_mutations(pbt)
    assert mutations["lora.r"] == [8, 16] and isinstance(mutations["train.learning_rate"], tune.search.sample.Float)
