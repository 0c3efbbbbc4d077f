"""The config tree: loading order, overrides, and error messages that say what, where and how."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rayft.config import RayftConfig, dump_config, load_config
from rayft.config.loader import parse_override
from rayft.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_defaults_then_yaml_then_overrides(tmp_path: Path) -> None:
    cfg_file = write(tmp_path, "train:\n  learning_rate: 0.001\n  max_steps: 5\nlora:\n  r: 4\n")
    cfg = load_config(cfg_file, ["train.learning_rate=1e-4", "lora.alpha=8"])
    assert cfg.train.learning_rate == pytest.approx(1e-4)
    assert cfg.train.max_steps == 5
    assert (cfg.lora.r, cfg.lora.alpha) == (4, 8)
    assert cfg.scaling.num_workers == RayftConfig().scaling.num_workers


def test_override_into_default_list_item() -> None:
    cfg = load_config(None, ["data.datasets.0.max_rows=10"])
    assert cfg.data.datasets[0].max_rows == 10
    assert cfg.data.datasets[0].path == "builtin:arithmetic"


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e-4", 1e-4), ("8", 8), ("true", True), ("null", None), ("[a, b]", ["a", "b"]), ("abc", "abc")],
)
def test_override_values_are_parsed_as_yaml(text: str, value: object) -> None:
    assert parse_override(f"x.y={text}") == ("x.y", value)


def test_every_problem_is_reported_at_once_with_path_value_and_fix() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["lora.rank=8", "train.learning_rate=-1", "train.lr=3", "data.max_seq_length=abc"])
    text = str(info.value)
    assert "4 problem(s)" in text
    assert "lora.rank: unknown key. Did you mean 'lora.r'?" in text
    assert "train.lr: unknown key. Did you mean 'train.learning_rate'?" in text
    assert "train.learning_rate = -1: Input should be greater than 0" in text
    assert "data.max_seq_length = 'abc'" in text


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [
        ("lr=1", "lr: unknown key. Did you mean 'train.learning_rate'?"),
        ("learning_rate=1e-4", "learning_rate: unknown key. Did you mean 'train.learning_rate'?"),
        ("lora_rank=8", "lora_rank: unknown key. Did you mean 'lora.r'?"),
        ("train.rank=8", "train.rank: unknown key. Did you mean 'lora.r'?"),
        ("epochs=2", "epochs: unknown key. Did you mean 'train.num_epochs'?"),
        ("lora.lr=1", "lora.lr: unknown key. Did you mean 'train.learning_rate'?"),
    ],
)
def test_aliases_resolve_across_sections(override: str, suggestion: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(suggestion)):
        load_config(None, [override])


def test_unknown_section_lists_valid_keys() -> None:
    with pytest.raises(ConfigError, match=r"trian: unknown key. Did you mean 'train'\?"):
        load_config(None, ["trian.max_steps=3"])


def test_trust_remote_code_needs_a_pinned_commit() -> None:
    with pytest.raises(ConfigError, match="needs 'revision' pinned to a 40-character commit"):
        load_config(None, ["model.trust_remote_code=true", "model.revision=main"])
    cfg = load_config(None, ["model.trust_remote_code=true", f"model.revision={'a' * 40}"])
    assert cfg.model.trust_remote_code


def test_missing_file_and_bad_yaml_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(write(tmp_path, "train: [unclosed\n"))
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_malformed_override_is_explained() -> None:
    with pytest.raises(ConfigError, match=r"is not of the form section\.key=value"):
        load_config(None, ["learning_rate"])
    with pytest.raises(ConfigError, match="is not an index of a list of 1 items"):
        load_config(None, ["data.datasets.3.path=x"])


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_config(None, ["train.max_steps=7", "lora.target_modules=[q_proj, v_proj]"])
    again = load_config(write(tmp_path, dump_config(cfg)))
    assert again == cfg


def test_sections_record_what_the_user_wrote(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "train:\n  max_steps: 2\n"))
    assert "train" in cfg.model_fields_set
    assert "data" not in cfg.model_fields_set


def test_every_field_is_documented() -> None:
    from rayft.cli.config_cmd import iter_fields

    undocumented = [path for path, _, _, desc in iter_fields(RayftConfig) if not desc.strip()]
    assert undocumented == []


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path: Path) -> None:
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("# rayft "), f"{path.name} must open with the command that runs it"
    load_config(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe\x00binary", r"is not UTF-8 text \(byte 0xff at offset 0\); give a YAML config file"),
        (b"", r"is empty \(line 1\); write the sections to change"),
        (b"# nothing but a comment\n", r"is empty \(line 1\)"),
        (b"train:\n  max_steps: 1\n  max_steps: 2\n", r"key 'max_steps' on line 3 repeats the one on line 2"),
        (b"name: a\ntrain: {}\nname: b\n", r"key 'name' on line 3 repeats the one on line 1"),
    ],
)
def test_files_yaml_would_read_silently_wrong_are_refused_naming_the_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_eval_scores_a_served_model_through_eval_endpoint_only() -> None:
    cfg = load_config(None, ["eval.backend=openai", "eval.endpoint.base_url=http://10.0.0.5:8000/v1"])
    assert cfg.eval.backend == "openai" and cfg.eval.endpoint.base_url == "http://10.0.0.5:8000/v1"
    with pytest.raises(ConfigError, match=r"eval.generation.endpoint: set eval.endpoint"):
        load_config(None, ["eval.generation.endpoint.base_url=http://10.0.0.5:8000/v1"])
