"""rayft: from a seed dataset to a fine-tuned, evaluated, exported LLM on Ray.

The public API is what this package root exports (``rayft.__all__``): :mod:`rayft.api`, the module
of the functions that run the commands (``rayft.api.train``, ``rayft.api.sdg`` ...), then
:func:`load_config`, the config classes, the error tree and the typed results.
Every other module is internal and may change between versions.

The functions live in :mod:`rayft.api`, not here, because two of them share their names with
internal subpackages (``rayft.sdg``, ``rayft.export``): at the root, the import system would set
those names to the subpackages.

The root stays light: names are resolved on first use (PEP 562), and importing any of them,
``rayft.api`` included, loads neither torch nor ray; a function imports its recipe when called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rayft._version import __version__

_EXPORTS: dict[str, str] = {
    "load_config": "rayft.config.loader",
    # config classes
    "RayftConfig": "rayft.config.schema",
    "ModelConfig": "rayft.config.model",
    "LoraConfig": "rayft.config.model",
    "DataConfig": "rayft.config.data",
    "DatasetConfig": "rayft.config.data",
    "TrainConfig": "rayft.config.train",
    "TuneConfig": "rayft.config.tune",
    "ScalingConfig": "rayft.config.train",
    "CheckpointConfig": "rayft.config.train",
    "FailureConfig": "rayft.config.train",
    "LoggingConfig": "rayft.config.train",
    "SdgConfig": "rayft.config.sdg",
    "EvalConfig": "rayft.config.evaluation",
    "ExportConfig": "rayft.config.evaluation",
    "GenerationConfig": "rayft.config.generation",
    "TaskConfig": "rayft.config.task",
    # bring your own model
    "CustomTask": "rayft.custom",
    "TaskData": "rayft.custom",
    # errors
    "RayftError": "rayft.errors",
    "ConfigError": "rayft.errors",
    "DataError": "rayft.errors",
    "ModelError": "rayft.errors",
    "ResourceError": "rayft.errors",
    "CheckpointError": "rayft.errors",
    "RunStateError": "rayft.errors",
    "StorageError": "rayft.errors",
    "MissingDependencyError": "rayft.errors",
    "TrainingError": "rayft.errors",
    "RunInterruptedError": "rayft.errors",
    # results
    "TrainResult": "rayft.training.driver.run",
    "TuneResult": "rayft.recipes.tune",
    "SdgResult": "rayft.recipes.sdg",
    "EvalResult": "rayft.recipes.evaluate",
    "CompareResult": "rayft.recipes.compare",
    "ExportResult": "rayft.recipes.export",
    "GenerateResult": "rayft.recipes.generate",
    "ChatResult": "rayft.recipes.chat",
    "PairsResult": "rayft.sdg.pair_maker",
    "PrepareResult": "rayft.data.prepare",
    "ServeHandle": "rayft.serving.handle",
    "PipelineResult": "rayft.pipeline.runner",
    "EvalSummary": "rayft.evaluation.summary",
    "CompareSummary": "rayft.evaluation.summary",
    "ModelSummary": "rayft.evaluation.summary",
    "MetricSummary": "rayft.evaluation.summary",
    "PairComparison": "rayft.evaluation.summary",
    "Estimate": "rayft.evaluation.stats",
    "PairedTest": "rayft.evaluation.stats",
}

__all__ = [
    "ChatResult",
    "CheckpointConfig",
    "CheckpointError",
    "CompareResult",
    "CompareSummary",
    "ConfigError",
    "CustomTask",
    "DataConfig",
    "DataError",
    "DatasetConfig",
    "Estimate",
    "EvalConfig",
    "EvalResult",
    "EvalSummary",
    "ExportConfig",
    "ExportResult",
    "FailureConfig",
    "GenerateResult",
    "GenerationConfig",
    "LoggingConfig",
    "LoraConfig",
    "MetricSummary",
    "MissingDependencyError",
    "ModelConfig",
    "ModelError",
    "ModelSummary",
    "PairComparison",
    "PairedTest",
    "PairsResult",
    "PipelineResult",
    "PrepareResult",
    "RayftConfig",
    "RayftError",
    "ResourceError",
    "RunInterruptedError",
    "RunStateError",
    "ScalingConfig",
    "SdgConfig",
    "SdgResult",
    "ServeHandle",
    "StorageError",
    "TaskConfig",
    "TaskData",
    "TrainConfig",
    "TrainResult",
    "TrainingError",
    "TuneConfig",
    "TuneResult",
    "__version__",
    "api",
    "load_config",
]


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use, and keep it here."""
    if name == "api":
        return importlib.import_module("rayft.api")  # the import sets it here
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rayft' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from rayft import api
    from rayft.config.data import DataConfig, DatasetConfig
    from rayft.config.evaluation import EvalConfig, ExportConfig
    from rayft.config.generation import GenerationConfig
    from rayft.config.loader import load_config
    from rayft.config.model import LoraConfig, ModelConfig
    from rayft.config.schema import RayftConfig
    from rayft.config.sdg import SdgConfig
    from rayft.config.task import TaskConfig
    from rayft.config.train import CheckpointConfig, FailureConfig, LoggingConfig, ScalingConfig, TrainConfig
    from rayft.config.tune import TuneConfig
    from rayft.custom import CustomTask, TaskData
    from rayft.data.prepare import PrepareResult
    from rayft.errors import (
        CheckpointError,
        ConfigError,
        DataError,
        MissingDependencyError,
        ModelError,
        RayftError,
        ResourceError,
        RunInterruptedError,
        RunStateError,
        StorageError,
        TrainingError,
    )
    from rayft.evaluation.stats import Estimate, PairedTest
    from rayft.evaluation.summary import CompareSummary, EvalSummary, MetricSummary, ModelSummary, PairComparison
    from rayft.pipeline.runner import PipelineResult
    from rayft.recipes.chat import ChatResult
    from rayft.recipes.compare import CompareResult
    from rayft.recipes.evaluate import EvalResult
    from rayft.recipes.export import ExportResult
    from rayft.recipes.generate import GenerateResult
    from rayft.recipes.sdg import SdgResult
    from rayft.recipes.tune import TuneResult
    from rayft.sdg.pair_maker import PairsResult
    from rayft.serving.handle import ServeHandle
    from rayft.training.driver.run import TrainResult
