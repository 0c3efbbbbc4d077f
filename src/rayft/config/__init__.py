"""The config tree: pydantic sections, YAML loading with dotted overrides, readable errors."""

from rayft.config.data import DataConfig, DatasetConfig
from rayft.config.loader import dump_config, load_config
from rayft.config.model import LoraConfig, ModelConfig
from rayft.config.schema import RayftConfig
from rayft.config.train import (
    CheckpointConfig,
    FailureConfig,
    LoggingConfig,
    ScalingConfig,
    TrainConfig,
)

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "DatasetConfig",
    "FailureConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "RayftConfig",
    "ScalingConfig",
    "TrainConfig",
    "dump_config",
    "load_config",
]
