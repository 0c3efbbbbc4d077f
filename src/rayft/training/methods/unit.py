"""A training method as its registry holds it: how the worker builds it around the run's causal LM, the
traits the loop reads before building it, and the pass over the prepared data (if any) the driver runs
before training. Each method folder declares its units with :class:`MethodUnit`;
:mod:`rayft.training.methods.registry` maps ``train.objective`` to them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from rayft.errors import ConfigError
from rayft.training.loop.method import Method, MethodTraits

if TYPE_CHECKING:
    from rayft.config.model import ModelConfig
    from rayft.config.schema import RayftConfig
    from rayft.config.train import TrainConfig
    from rayft.data.prepared import PreparedData
    from rayft.training.loop.objective import CausalLm

T = TypeVar("T")

DataPass = Callable[["PreparedData", bool], "PreparedData"]  # (prepared data, use Ray) -> the data to train on


def no_traits(train: TrainConfig) -> MethodTraits:
    """The traits of a method with none of its own."""
    return MethodTraits()


def no_data_pass(cfg: RayftConfig, model: ModelConfig) -> DataPass | None:
    """No pass over the prepared data."""
    return None


@dataclass(frozen=True)
class MethodUnit:
    """One training method: ``build`` makes the worker's :class:`~rayft.training.loop.method.Method` around
    the run's causal LM; ``traits`` are what the loop reads first; ``data_pass`` gives the driver a pass over
    the prepared data to run before training (DPO's reference log-probabilities), or None."""

    build: Callable[[CausalLm], Method]
    traits: Callable[[TrainConfig], MethodTraits] = no_traits
    data_pass: Callable[[RayftConfig, ModelConfig], DataPass | None] = no_data_pass


class Registry(Generic[T]):
    """Named implementations of one kind (a loss, an advantage estimator), each registered where it is
    defined with the :meth:`register` decorator, as verl's ``core_algos`` does: adding one touches one file.
    ``what`` is the config path that names them, for the error a name outside the registry gets."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator that registers what it decorates under ``name`` (once)."""

        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.what}: {name!r} is registered twice")
            self._items[name] = item
            return item

        return add

    def __getitem__(self, name: str) -> T:
        """What ``name`` names; ConfigError for a name nothing registered."""
        if name not in self._items:
            raise ConfigError(f"{self.what}={name!r} is not one of {', '.join(sorted(self._items))}; set one of them")
        return self._items[name]

    def names(self) -> list[str]:
        """Every registered name, in registration order."""
        return list(self._items)
