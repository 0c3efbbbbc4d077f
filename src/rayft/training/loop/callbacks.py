"""Loop callbacks: code of the user's (or of the tests') that the training loop calls at fixed
points on every worker, named in ``train.callbacks`` as ``"package.module:ClassName"``.

Each worker imports and builds its own instances when it starts (and again after a restart), with
the ``options`` given in the config as keyword arguments. A callback implements any of the hooks
of :class:`LoopCallback`; the hooks it leaves out are not called. Hooks run in the training thread,
between the steps: what they do takes training time, and what they raise ends the attempt (and is
retried as any other worker failure, ``failure.max_failures``). A callback must not change what is
trained if the run is to resume bit for bit.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayft.config.train import CallbackConfig
from rayft.errors import ConfigError

SAVE_STAGES = ("model_files", "trainer_files", "before_manifest", "before_commit")
"""The points of a checkpoint save that :meth:`LoopCallback.on_save_stage` is called at, in order:
after the model files are written, after the trainer state is, before the manifest that makes the
checkpoint complete, and before the commit that publishes it (on rank 0, which writes them)."""

HOOKS = ("on_train_start", "on_step_begin", "on_step_end", "on_micro_batch", "on_save_stage", "on_train_end")


@dataclass
class StepInfo:
    """Where the loop is, as the hooks see it (one object per worker, updated in place)."""

    rank: int
    world_size: int
    run_dir: str
    step: int = 0  # the optimizer step about to run (on_step_begin) or just taken (on_step_end), 1-based
    sample_ids: list[int] = field(default_factory=list)  # of this rank's micro-batches of the step
    metrics: dict[str, float] = field(default_factory=dict)  # on_step_end: the step's loss and more
    stop_requested: Callable[[], bool] = lambda: False  # whether the run was asked to stop (SIGTERM)


class LoopCallback:
    """The hooks a loop callback may implement (subclassing this is optional; every hook here
    does nothing)."""

    def on_train_start(self, info: StepInfo) -> None:
        """Once the model is built or restored, before the first step (``info.step``: the steps done)."""

    def on_step_begin(self, info: StepInfo) -> None:
        """Before optimizer step ``info.step``, its micro-batches loaded (``info.sample_ids``)."""

    def on_step_end(self, info: StepInfo) -> None:
        """After optimizer step ``info.step`` (``info.metrics``: its loss and gradient norm)."""

    def on_micro_batch(self, info: StepInfo) -> None:
        """Before each micro-batch is collated (on the way from the data to the step)."""

    def on_save_stage(self, step: int, stage: str) -> None:
        """At each stage (:data:`SAVE_STAGES`) of the save of the checkpoint of ``step``; called from
        the background upload thread when ``checkpoint.async_upload`` is on."""

    def on_train_end(self, info: StepInfo) -> None:
        """After the last step and the final save, when the run finishes (not when it fails)."""


class Callbacks:
    """The callbacks of one worker, called in the order configured."""

    def __init__(self, callbacks: Sequence[Any] = ()) -> None:
        self._hooks = {
            name: [getattr(c, name) for c in callbacks if callable(getattr(c, name, None))] for name in HOOKS
        }

    def __bool__(self) -> bool:
        return any(self._hooks.values())

    def call(self, hook: str, *args: Any) -> None:  # each hook has its own arguments (StepInfo, a stage name)
        """Call ``hook`` of every callback that has it."""
        for function in self._hooks[hook]:
            function(*args)

    def wants(self, hook: str) -> bool:
        """Whether any callback implements ``hook`` (to skip gathering what only it would read)."""
        return bool(self._hooks[hook])


def load_callbacks(configs: Sequence[CallbackConfig]) -> Callbacks:
    """Import and build the callbacks of ``train.callbacks``; a one-line :class:`ConfigError` names
    the one that cannot be imported or built."""
    return Callbacks([build_callback(config, index) for index, config in enumerate(configs)])


def build_callback(config: CallbackConfig, index: int) -> Any:  # a user's class: any object with some hooks
    """One callback: the class ``config.target`` names, called with ``config.options``."""
    where = f"train.callbacks.{index}"
    module_name, _, attribute = config.target.partition(":")
    try:
        target: Any = importlib.import_module(module_name)  # a module, then the attributes the path names
        for name in attribute.split("."):
            target = getattr(target, name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"{where}: cannot import {config.target!r} on this worker ({type(exc).__name__}: {exc}); install the "
            "package that holds it on every node, or put its directory on PYTHONPATH (runtime_env on a cluster)"
        ) from None
    try:
        return target(**config.options)
    except TypeError as exc:
        raise ConfigError(f"{where}: {config.target} does not take the options {config.options} ({exc})") from None
