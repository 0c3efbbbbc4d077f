"""The public API: the exact names the package root and ``rayft.api`` export, each importable, listed, and
light; one calling convention for the functions; the root module is a plain module."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

import rayft
from rayft.syntax import parse

PUBLIC = [
    "ChatResult", "PairsResult", "PrepareResult",
    "CheckpointConfig", "CheckpointError", "CompareResult", "CompareSummary", "ConfigError", "CustomTask",
    "DataConfig", "TaskConfig", "TaskData",
    "DataError", "DatasetConfig", "Estimate", "EvalConfig", "EvalResult", "EvalSummary", "ExportConfig",
    "ExportResult", "FailureConfig", "GenerateResult", "GenerationConfig", "LoggingConfig", "LoraConfig",
    "MetricSummary",
    "MissingDependencyError", "ModelConfig", "ModelError", "ModelSummary", "PairComparison", "PairedTest",
    "PipelineResult", "RayftConfig", "RayftError", "ResourceError", "RunInterruptedError", "RunStateError",
    "ScalingConfig", "SdgConfig", "SdgResult", "ServeHandle", "StorageError", "TrainConfig", "TrainResult",
    "TrainingError",
    "TuneConfig", "TuneResult", "__version__", "api", "load_config",
]  # fmt: skip
FUNCTIONS = [
    "chat", "compare", "evaluate", "export", "generate", "pairs", "prepare_data", "render_manifests",
    "run_pipeline", "sdg", "serve", "train", "train_rank", "tune",
]  # fmt: skip
RESULTS = [
    "TrainResult",
    "SdgResult",
    "EvalResult",
    "CompareResult",
    "ExportResult",
    "GenerateResult",
    "PipelineResult",
    "ChatResult",
    "PairsResult",
    "PrepareResult",
    "TuneResult",
]
# Each command's recipe; `rayft run`'s sits above the recipes it calls, in the pipeline package.
COMMANDS = ["train", "sdg", "evaluate", "compare", "export", "generate", "chat", "tune", "serve"]
RECIPES = [*(f"rayft.recipes.{name}" for name in COMMANDS), "rayft.pipeline.runner"]

LIGHT_CHECK = (
    "import sys\n"
    "import rayft\n"
    "for name in rayft.__all__:\n"
    "    getattr(rayft, name)\n"
    "from rayft.api import train, sdg, evaluate, compare, export, generate, run_pipeline, serve, tune\n"
    "heavy = sorted(m for m in ('torch', 'ray', 'transformers', 'peft', 'datasets') if m in sys.modules)\n"
    "print('HEAVY=' + ','.join(heavy))\n"
)


def test_the_public_names_are_pinned() -> None:
    assert sorted(rayft.__all__) == sorted(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_name_is_importable_and_listed(name: str) -> None:
    assert getattr(rayft, name) is not None
    assert name in dir(rayft)
    namespace: dict[str, object] = {}
    exec(f"from rayft import {name}", namespace)
    assert namespace[name] is getattr(rayft, name)


def test_an_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'trian'"):
        rayft.trian  # noqa: B018


def test_importing_every_public_name_loads_neither_torch_nor_ray() -> None:
    out = subprocess.run([sys.executable, "-c", LIGHT_CHECK], capture_output=True, text=True, check=True)
    assert "HEAVY=\n" in out.stdout, out.stdout


def test_the_api_names_are_pinned_and_are_functions() -> None:
    assert sorted(rayft.api.__all__) == FUNCTIONS
    assert all(inspect.isfunction(getattr(rayft.api, name)) for name in FUNCTIONS)


def test_the_root_is_a_plain_module_and_subpackages_keep_their_names() -> None:
    assert type(rayft) is types.ModuleType
    assert inspect.ismodule(importlib.import_module("rayft.sdg.rows")) and inspect.ismodule(rayft.sdg)
    assert inspect.ismodule(importlib.import_module("rayft.export.card")) and inspect.ismodule(rayft.export)
    assert rayft.api is importlib.import_module("rayft.api")


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_function_takes_the_config_first_and_options_by_keyword(name: str) -> None:
    parameters = list(inspect.signature(getattr(rayft.api, name)).parameters.values())
    assert parameters[0].name == "cfg" and parameters[0].default is inspect.Parameter.empty
    positional = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    # after the config: the model (or models), then the paths the command cannot do without
    assert positional[1:] in ([], ["model"], ["models"], ["target"], ["model", "output_dir"],
                              ["model", "input_path", "output_path"]), (name, positional)  # fmt: skip
    assert all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in parameters)


def test_function_signatures() -> None:
    assert list(inspect.signature(rayft.load_config).parameters) == ["path", "overrides"]
    train = inspect.signature(rayft.api.train)
    assert list(train.parameters) == ["cfg", "resume"] and train.parameters["resume"].default is False
    assert list(inspect.signature(rayft.api.compare).parameters)[:2] == ["cfg", "models"]
    assert list(inspect.signature(rayft.api.export).parameters)[:3] == ["cfg", "model", "output_dir"]
    generate = list(inspect.signature(rayft.api.generate).parameters)
    assert generate[:4] == ["cfg", "model", "input_path", "output_path"]
    serve = inspect.signature(rayft.api.serve)
    assert list(serve.parameters) == ["cfg", "models", "host", "port", "address"]
    assert serve.parameters["port"].default is None  # the config's serve.port, as `rayft serve`


# Plain data a function may return besides rayft's types: Kubernetes objects as JSON-like dicts.
PLAIN_DATA = {"list", "dict", "str", "Any"}


def _returned_names(annotation: str) -> tuple[set[str], set[str]]:
    """The names of a return annotation (a string: the module defers annotations): those at its top level
    (the members of a union), and those inside a container's brackets."""
    top: set[str] = set()
    inner: set[str] = set()

    def visit(node: ast.expr, nested: bool) -> None:
        if isinstance(node, ast.BinOp):  # X | None
            visit(node.left, nested)
            visit(node.right, nested)
        elif isinstance(node, ast.Subscript):
            visit(node.value, nested)
            for part in ast.walk(node.slice):
                if isinstance(part, ast.Name):
                    inner.add(part.id)
        elif isinstance(node, ast.Name):
            (inner if nested else top).add(node.id)
        elif isinstance(node, ast.Constant) and node.value is None:
            top.add("None")

    visit(parse(annotation, mode="eval").body, nested=False)
    return top, inner


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_function_returns_a_type_rayft_exports(name: str) -> None:
    """A user can name what any function returns from `rayft` itself (a result, or a container of plain data),
    never an internal module's type or a bare number."""
    annotation = getattr(rayft.api, name).__annotations__["return"]
    top, inner = _returned_names(annotation)
    exported = set(rayft.__all__)
    assert top - {"None"} <= exported | {"list", "dict"}, (name, annotation)
    assert inner <= PLAIN_DATA | exported, (name, annotation)


@pytest.mark.parametrize("name", RESULTS)
def test_results_are_frozen_dataclasses(name: str) -> None:
    cls = getattr(rayft, name)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_exposes_run(recipe: str) -> None:
    module = importlib.import_module(recipe)
    assert next(iter(inspect.signature(module.run).parameters)) == "cfg"


def test_load_config_takes_a_path_and_dotted_overrides(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text("name: nb\nlora: {r: 8}\n")
    cfg = rayft.load_config(path, ["train.learning_rate=1e-4", "lora.r=4"])
    assert isinstance(cfg, rayft.RayftConfig)
    assert (cfg.name, cfg.lora.r, cfg.train.learning_rate) == ("nb", 4, 1e-4)
    with pytest.raises(rayft.ConfigError, match="lora.rr"):
        rayft.load_config(path, ["lora.rr=4"])


def test_the_error_tree_has_one_root() -> None:
    errors = [n for n in PUBLIC if n.endswith("Error")]
    assert all(issubclass(getattr(rayft, n), rayft.RayftError) for n in errors)
