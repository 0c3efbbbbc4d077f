"""GRPO with the 'sql' reward on rayft's built-in text-to-SQL set and a tiny random model: each prompt's
table is prepared with it (on Ray Data), travels with it to the rewards on colocated rollouts and on
generation actors, and every completion is executed on it (rl/reward/sql, eval/reward/sql), with no
reward error; a user's function with a ``row`` parameter reads the same row."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from rayft.config import RayftConfig
from rayft.data.prepared import PreparedData
from tests.integration.test_train_rl import GRPO
from tests.support.runs import read_metrics, tiny_config, train_on

pytestmark = pytest.mark.integration

PROMPTS = ("data.datasets=[{path: 'builtin:sql', max_rows: 24, format: template, input_template: '{input}', "
           "output_template: '{output}'}]")  # fmt: skip
REWARDS = ("train.rl.rewards=[{function: sql}, {function: 'sql_row_rewards:table_rows'}]",
           "train.rl.row_columns=[table]")  # fmt: skip


@pytest.fixture
def row_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's reward that reads its row: 1 when the row's table (JSON) has rows."""
    (tmp_path / "sql_row_rewards.py").write_text(textwrap.dedent('''
        import json

        def table_rows(completion, reference, row):
            return float(len(json.loads(row["table"])["rows"]) > 0)
    '''))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))


def sql_config(tiny_model_dir: Path, storage: Path, *overrides: str) -> RayftConfig:
    return tiny_config(tiny_model_dir, storage, PROMPTS, f"data.cache_dir={storage.parent / 'cache'}", *GRPO,
                       *REWARDS, "data.validation_fraction=0.2", *overrides)  # fmt: skip


@pytest.fixture(scope="module")
def sql_prompts(ray_session: None, tiny_model_dir: Path, tmp_path_factory: Any) -> PreparedData:
    from rayft.training.driver.startup import prepare_training_data

    cfg = sql_config(tiny_model_dir, tmp_path_factory.mktemp("prep"))
    return prepare_training_data(cfg, None, use_ray=True)


@pytest.mark.parametrize("placement", ["colocated", "actors"])
def test_grpo_with_the_sql_reward_executes_every_completion_on_its_rows_table(
    tiny_model_dir: Path, sql_prompts: PreparedData, tmp_path: Path, row_reward: None, placement: str
) -> None:
    cfg = sql_config(tiny_model_dir, tmp_path, "scaling.num_workers=0", "train.max_steps=2", "train.save_steps=2",
                     "train.eval_steps=2", f"train.rl.rollout.placement={placement}",
                     "train.rl.rollout.start_timeout_s=120", "train.rl.rollout.generate_timeout_s=120")  # fmt: skip
    records = read_metrics(train_on(cfg, sql_prompts))
    steps = [r for r in records if "train/loss" in r]
    assert len(steps) == 2
    for record in steps:
        assert 0.0 <= record["rl/reward/sql"] <= 1.0
        assert record["rl/reward_errors/sql"] == 0  # every table parsed and every reference ran on it
        assert record["rl/reward/table_rows"] == 1.0 and record["rl/reward_errors/table_rows"] == 0
    evaluated = [r for r in records if "eval/reward/sql" in r]
    assert evaluated and evaluated[-1]["eval/reward/table_rows"] == 1.0
