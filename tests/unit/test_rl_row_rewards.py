"""Rewards that read their row: the 'sql' reward (execution accuracy on the row's own table, in eval's
read-only SQLite sandbox), a user's function with a ``row`` parameter, the columns carried with each
prompt through preparation, and a row without its table stopped at start with the column named."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from rayft.config import load_config
from rayft.config.rl import RewardConfig
from rayft.data.builtin.sql import iter_sql_examples
from rayft.data.prepare import prepare_data
from rayft.data.prepared import UNIT_COLUMNS, PreparedData
from rayft.errors import ConfigError, DataError
from rayft.evaluation.rewards import RewardSet, sql_reward
from rayft.training.methods.rl.batches import carried_row
from rayft.training.methods.rl.sampling import PromptBatch

EXAMPLE = next(iter_sql_examples(1))  # SELECT MAX(year) FROM films WHERE director = 'Bruno' on its table
ROW = {"table": EXAMPLE["table"]}
REFERENCE = EXAMPLE["output"]
SQL_PROMPTS = ("data.datasets=[{path: 'builtin:sql', max_rows: 12, format: template, input_template: '{input}', "
               "output_template: '{output}'}]")  # fmt: skip


def test_the_sql_reward_is_1_for_the_reference_result_and_0_otherwise() -> None:
    reward = sql_reward("table")
    assert reward(REFERENCE, REFERENCE, ROW) == 1.0
    assert reward("SELECT year FROM films WHERE director = 'Bruno'", REFERENCE, ROW) == 1.0  # same result
    assert reward("SELECT MIN(year) FROM films", REFERENCE, ROW) == 0.0  # runs, another result
    assert reward("SELEC MAX(year) FROM films", REFERENCE, ROW) == 0.0  # invalid SQL
    assert reward("SELECT MAX(yr) FROM films", REFERENCE, ROW) == 0.0  # no such column
    assert reward("", REFERENCE, ROW) == 0.0


@pytest.mark.parametrize(
    "query",
    ["DROP TABLE films", "DELETE FROM films", "UPDATE films SET year = 2016", "INSERT INTO films (year) VALUES (1)",
     "ATTACH DATABASE '{dir}/x.db' AS x", "PRAGMA writable_schema = 1"],
)  # fmt: skip
def test_a_query_that_tries_to_write_is_refused_and_scores_0(query: str, tmp_path: Path) -> None:
    reward = sql_reward("table")
    assert reward(query.format(dir=tmp_path), REFERENCE, ROW) == 0.0
    assert not (tmp_path / "x.db").exists()
    assert reward(REFERENCE, REFERENCE, ROW) == 1.0  # the table is intact


def test_the_sql_reward_scores_a_batch_with_each_completions_row_and_counts_bad_tables() -> None:
    rewards = RewardSet.build([RewardConfig(function="sql"), RewardConfig(function="length")], 16)
    assert rewards.reads_rows and rewards.names == ["sql", "length"]
    other = next(r for r in iter_sql_examples(20) if r["table"] != EXAMPLE["table"])
    completions = [REFERENCE, other["output"], "SELECT 1", other["output"]]
    rows = [ROW, {"table": other["table"]}, ROW, {"table": "{not json"}]
    scores = rewards.score(completions, [REFERENCE, other["output"], REFERENCE, other["output"]], rows)
    assert scores.by_function["sql"] == [1.0, 1.0, 0.0, 0.0]
    assert scores.errors == {"sql": 1, "length": 0}  # the table that does not parse: counted, the batch goes on


def test_a_user_function_with_a_row_parameter_gets_the_carried_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "row_rewards.py").write_text(textwrap.dedent('''
        def mentions_table(completion, reference, row):
            return float(row["table_name"] in completion)

        def plain(completion, reference):
            return 1.0
    '''))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    functions = [RewardConfig(function="row_rewards:mentions_table"), RewardConfig(function="row_rewards:plain")]
    rewards = RewardSet.build(functions, 16, row_columns=["table_name"])
    scores = rewards.score(["from films", "from cities"], ["r", "r"], [{"table_name": "films"}] * 2)
    assert scores.by_function == {"mentions_table": [1.0, 0.0], "plain": [1.0, 1.0]}
    with pytest.raises(ConfigError, match=r"takes a row, but train\.rl\.row_columns is empty; list the columns"):
        RewardSet.build(functions, 16)
    sys.modules.pop("row_rewards", None)


def test_the_config_carries_the_sql_tables_column_and_the_listed_ones() -> None:
    rewards = "train.rl.rewards=[{function: sql}, {function: sql, table_column: tbl, name: sql2}]"
    cfg = load_config(None, ["train.objective=grpo", "data.packing=false", rewards, "train.rl.row_columns=[extra]"])
    assert cfg.train.rl.carried_columns == ("extra", "table", "tbl")
    assert load_config(None, ["train.objective=grpo", "data.packing=false"]).train.rl.carried_columns == ()
    with pytest.raises(ConfigError, match="table_column is only read by 'sql'"):
        load_config(None, ["train.objective=grpo", "data.packing=false",
                           "train.rl.rewards=[{function: math, table_column: t}]"])  # fmt: skip


def test_a_prompt_batch_gives_each_completion_its_prompts_row() -> None:
    batch = PromptBatch([[1], [2]], ["a", "b"], [0, 1], [{"table": "x"}, {"table": "y"}])
    assert batch.rows_of_completions(2) == [{"table": "x"}, {"table": "x"}, {"table": "y"}, {"table": "y"}]
    assert PromptBatch([[1]], ["a"], [0]).rows_of_completions(2) == [{}, {}]  # no columns carried
    assert carried_row({"row": json.dumps(ROW)}) == ROW
    with pytest.raises(DataError, match="the prepared data carries none; prepare the data with this config"):
        carried_row({"input_ids": [1]})


def _units(prepared: PreparedData) -> list[dict[str, Any]]:
    return [row for f in prepared.train.files for row in pq.read_table(f).to_pylist()]


def test_preparation_carries_each_rows_table_beside_its_prompt(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = load_config(None, [f"model.name={tiny_model_dir}", SQL_PROMPTS, "data.packing=false",
                             "data.validation_fraction=0", f"data.cache_dir={tmp_path}"])  # fmt: skip
    carried = prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=False, carry=("table",))
    plain = prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)
    assert carried.key != plain.key  # another cache entry: a plain preparation is never reused without tables
    tables = {r["table"] for r in iter_sql_examples(200)}  # the train split's first 12 are among them
    units = _units(carried)
    assert set(units[0]) == {*UNIT_COLUMNS, "row"} and set(_units(plain)[0]) == set(UNIT_COLUMNS)
    by_table = {json.loads(u["row"])["table"] for u in units}
    assert len(units) == 12 and by_table <= tables and len(by_table) == 12


def test_a_row_without_its_table_stops_preparation_naming_the_column(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = [next(iter_sql_examples(1)), {k: v for k, v in EXAMPLE.items() if k != "table"}]
    path = tmp_path / "sql.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [f"model.name={tiny_model_dir}", f"data.cache_dir={tmp_path / 'cache'}",
                             f"data.datasets=[{{path: '{path}', format: template, input_template: '{{input}}', "
                             "output_template: '{output}'}]", "data.packing=false", "data.validation_fraction=0",
                             "data.max_rejected_fraction=1"])  # fmt: skip
    with pytest.raises(DataError, match=r"^data: 1 of 2 rows have no value in the column\(s\) 'table' that "):
        prepare_data(cfg.data, cfg.model, 0, report_dir=tmp_path / "report", use_ray=False, carry=("table",))
    report = (tmp_path / "report" / "rejected.jsonl").read_text()
    assert "missing_row_column" in report and "'table'" in report


def test_a_batch_of_sql_rewards_runs_in_one_process_and_a_stuck_query_fails_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sql reward scores a batch in one sandboxed process; when a query stops that process (here SQLite's
    own checks are off, so the wall clock does), each query is scored again on its own and only it fails."""
    from rayft.evaluation import sql

    starts = []
    run = sql.run_python
    monkeypatch.setattr(sql, "run_python", lambda *a, **k: starts.append(1) or run(*a, **k))
    rewards = RewardSet.build([RewardConfig(function="sql")], 16)
    batch = [REFERENCE, "SELECT MIN(year) FROM films", "SELEC", REFERENCE]
    assert rewards.score(batch, [REFERENCE] * 4, [ROW] * 4).by_function["sql"] == [1.0, 0.0, 0.0, 1.0]
    assert len(starts) == 1
    monkeypatch.setattr(sql, "MAX_INSTRUCTIONS", 10**15)
    monkeypatch.setattr(sql, "TIMEOUT_S", 3600.0)
    monkeypatch.setattr(sql, "batch_wall_s", lambda queries: 2.0)
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    scores = rewards.score([REFERENCE, endless, REFERENCE], [REFERENCE] * 3, [ROW] * 3)
    assert scores.by_function["sql"] == [1.0, 0.0, 1.0] and scores.errors == {"sql": 0}
    assert len(starts) == 1 + 1 + 3  # the batch, stopped; then each query alone
