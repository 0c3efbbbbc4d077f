"""Every YAML config shipped in configs/ loads, validates, and requests the stages it documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.config.checks import check_unread_method_sections
from rayft.config.pairs import preference_train_section
from rayft.pipeline.plan import requested_stages

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_configs_are_shipped() -> None:
    assert {p.name for p in CONFIGS} >= {"quickstart.yaml", "gsm8k-qwen2.5-1.5b.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates(path: Path) -> None:
    cfg = load_config(path)
    assert requested_stages(cfg.model_fields_set), f"{path.name} requests no pipeline stage"


def test_quickstart_runs_offline_on_cpu() -> None:
    cfg = load_config(CONFIGS[0].parent / "quickstart.yaml")
    assert requested_stages(cfg.model_fields_set) == ["sdg", "train", "eval", "export"]
    assert (
        cfg.model.name == "smollm2-135m-instruct" and cfg.scaling.num_workers == 2 and cfg.scaling.use_gpu is not True
    )
    assert cfg.sdg.generator == "symbolic" and cfg.sdg.seeds.path.startswith("builtin:")
    assert cfg.eval.datasets[0].split == "test" and cfg.eval.task == "gsm8k"
    eval_paths = {(d.path, d.split) for d in cfg.eval.datasets}
    assert eval_paths <= {(d.path, d.split) for d in cfg.sdg.decontamination.datasets}


def test_gpu_config_is_the_full_size_pipeline() -> None:
    cfg = load_config(CONFIGS[0].parent / "gsm8k-qwen2.5-1.5b.yaml")
    assert cfg.sdg.generator == "llm" and cfg.sdg.teacher.backend == "vllm"
    assert "Qwen2.5-1.5B-Instruct" in cfg.sdg.teacher.model.name
    assert cfg.scaling.use_gpu and cfg.eval.backend == "vllm"


def test_gsm8k_local_config_seeds_from_train_and_evaluates_on_test(tmp_path: Path) -> None:
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    overrides = [
        f"sdg.seeds.path={train}",
        f"sdg.decontamination.datasets.0.path={test}",
        f"eval.datasets.0.path={test}",
    ]
    cfg = load_config(CONFIGS[0].parent / "gsm8k-local.yaml", overrides)
    assert requested_stages(cfg.model_fields_set) == ["sdg", "train", "eval", "export"]
    assert cfg.sdg.seeds.path == str(train) and not cfg.sdg.seeds.path.startswith("builtin:")
    assert [d.path for d in cfg.eval.datasets] == [str(test)]
    assert [d.path for d in cfg.sdg.decontamination.datasets] == [str(test)]
    assert cfg.eval.task == "gsm8k" and cfg.model.name == "smollm2-135m-instruct"
    assert not any(p.startswith("builtin:") for p in (cfg.sdg.seeds.path, *(d.path for d in cfg.eval.datasets)))


def test_t5_text_to_sql_is_the_zero3_gpu_setup() -> None:
    cfg = load_config(CONFIGS[0].parent / "t5-text-to-sql.yaml")
    assert requested_stages(cfg.model_fields_set) == ["train", "eval", "export"]
    assert cfg.model.name == "google-t5/t5-3b" and cfg.model.dtype == "bfloat16"
    assert (cfg.train.method, cfg.train.strategy, cfg.train.mixed_precision) == ("full", "deepspeed", "bf16")
    assert cfg.scaling.num_workers == 3 and cfg.scaling.use_gpu is True
    assert cfg.data.packing is False and cfg.data.datasets[0].path == "htriedman/wikisql"
    assert cfg.eval.task == "sql" and cfg.eval.backend == "hf" and cfg.eval.use_chat_template is False
    # eval prompts with the text training rendered: the instruction, then the input
    wikisql_instruction = "Translate the following into a SQL query"
    source = cfg.data.datasets[0].input_template or ""
    assert source.format(instruction=wikisql_instruction, input="Q") == (cfg.eval.prompt_template or "").format(
        question="Q"
    )
    train_split, eval_split = cfg.data.datasets[0].split, cfg.eval.datasets[0].split
    assert train_split == "train[:98%]" and eval_split == "train[98%:]"  # disjoint slices of the one split


def test_t5_sql_cpu_learns_the_builtin_set_offline() -> None:
    cfg = load_config(CONFIGS[0].parent / "t5-sql-cpu.yaml")
    assert requested_stages(cfg.model_fields_set) == ["train", "eval", "export"]
    assert cfg.scaling.use_gpu is not True and cfg.train.method == "full" and cfg.data.packing is False
    assert [(d.path, d.split) for d in cfg.data.datasets] == [("builtin:sql", "train")]
    assert [(d.path, d.split) for d in cfg.eval.datasets] == [("builtin:sql", "test")]
    assert cfg.eval.task == "sql" and cfg.eval.question_field == "input" and cfg.eval.prompt_template == "{question}"
    assert cfg.data.datasets[0].input_template == "{input}"  # eval prompts with the training source


def test_gsm8k_dpo_config_trains_sft_then_dpo_on_on_policy_pairs(tmp_path: Path) -> None:
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    overrides = [
        f"data.datasets.0.path={train}",
        f"pairs.problems.path={train}",
        f"pairs.decontamination.datasets.0.path={test}",
        f"eval.datasets.0.path={test}",
    ]
    cfg = load_config(CONFIGS[0].parent / "gsm8k-dpo.yaml", overrides)
    assert requested_stages(cfg.model_fields_set) == ["train", "pairs", "preference", "eval"]
    assert cfg.model.name == "smollm2-135m-instruct" and cfg.train.objective == "sft" and cfg.pairs.model is None
    assert cfg.preference.objective == "dpo" and cfg.eval.task == "gsm8k"
    second = preference_train_section(cfg.train, cfg.preference)
    assert (second.objective, second.preference.beta, second.learning_rate) == ("dpo", 0.1, 5.0e-5)
    check_unread_method_sections(cfg, requested_stages(cfg.model_fields_set))
    assert cfg.data.datasets[0].input_template == cfg.pairs.prompt_template  # the pairs prompt as SFT taught
    assert [d.path for d in cfg.pairs.decontamination.datasets] == [d.path for d in cfg.eval.datasets] == [str(test)]


def test_sql_grpo_rewards_execution_on_each_rows_own_table() -> None:
    cfg = load_config(CONFIGS[0].parent / "sql-grpo.yaml")
    assert cfg.train.objective == "grpo" and [r.function for r in cfg.train.rl.rewards] == ["sql", "regex"]
    assert cfg.train.rl.carried_columns == ("table",) and cfg.data.datasets[0].path == "builtin:sql"
    assert (cfg.eval.task, cfg.eval.table_field, cfg.eval.datasets[0].split) == ("sql", "table", "test")
