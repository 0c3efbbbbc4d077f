"""Whether a run starts, resumes, is kept or is replaced: one pure decision for ``rayft train`` and
for the train stage of ``rayft run``, made from what the store holds. No I/O.

``rayft train`` says what it wants (``--resume`` or not): a finished run is never reopened, an
existing one is continued only with ``--resume`` and only when the settings that shape what was
already trained are unchanged (:data:`RESUMABLE_CHANGES` may differ). ``rayft run`` decides by
itself: the same settings keep a finished run and resume an unfinished one; other settings replace
it (the old one moved aside) where the store can keep it, and are refused where it cannot (a URI).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rayft.errors import ConfigError, RunStateError

RESUMABLE_CHANGES = (
    "scaling.",
    "failure.",
    "logging.",
    "checkpoint.",
    "k8s.",  # where the job runs, not what it trains
    "train.callbacks",  # code that watches the loop (or tests it), not what it trains
    "train.strategy",  # checkpoints hold whole weights and name-keyed optimizer state under every strategy
    # DeepSpeed's own settings (offload, buckets): where state lives while training, not what it holds; rayft
    # owns batch sizes, precision, clipping and the ZeRO stage, and a change of strategy drops them all.
    "train.deepspeed",
    "train.max_steps",
    "train.num_epochs",
    "train.eval_steps",
    "train.save_steps",
    "train.logging_steps",
    "train.early_stopping_patience",
)
"""Settings that may change when a run is resumed: they do not change what was already trained."""

RETUNABLE_CHANGES = (
    "train.learning_rate",
    "train.min_learning_rate",
    "train.warmup_steps",
    "train.weight_decay",
    "train.max_grad_norm",
)
"""Optimiser settings a run may also change when it continues from a checkpoint with new
hyper-parameters on purpose (Population Based Training's exploit): they change how the next steps
update the weights, never the shape of the model, the data or the steps already taken."""

StartAction = Literal["start", "restart", "resume", "keep", "replace"]
DataChange = Literal["refuse", "accept"]


@dataclass(frozen=True)
class RunState:
    """What a store already holds of a run: a saved config, a finished final/, its complete checkpoints,
    and whether any step was trained (``logged``: ``metrics.jsonl`` holds a record)."""

    exists: bool
    finished: bool
    steps: tuple[int, ...] = ()
    logged: bool = False

    @property
    def trained(self) -> bool:
        """Whether the run trained at least one step (a checkpoint or a logged metric shows it)."""
        return self.finished or bool(self.steps) or self.logged


@dataclass(frozen=True)
class StartPlan:
    """What to do with the run before training.

    ``start``: a new run. ``resume``: continue from the newest complete checkpoint, after removing
    incomplete ones. ``keep``: it is finished with these settings; nothing to train. ``replace``:
    move the earlier run aside, then start a new one. ``restart``: the run's earlier start failed
    before it trained a step; clear what it left and start again (a retry is never blocked by it).
    """

    action: StartAction
    reason: str


def plan_train_start(
    where: str,
    name: str,
    state: RunState,
    saved: dict[str, Any] | None,
    wanted: dict[str, Any],
    *,
    resume: bool,
    retune: bool = False,
) -> StartPlan:
    """``rayft train``: start or resume the run ``name`` at ``where``, or raise why not.

    Args:
        where: The run's location as it may be shown (a directory or a masked URI).
        name: The run name, for the fix in messages.
        state: What the store holds.
        saved: The config saved in the run (None when there is none).
        wanted: The config to run with, as it is saved (``yaml.safe_load(dump_config(cfg))``).
        resume: Whether ``--resume`` was given.
        retune: Continue with new optimiser hyper-parameters (:data:`RETUNABLE_CHANGES` may also differ).

    Raises:
        RunStateError: the run is finished, exists without ``--resume``, or is missing with it. A run
            that saved this run's config and trained no step is started again instead (``restart``).
        ConfigError: ``--resume`` with settings that would mix two different runs.
    """
    if resume and not state.exists:
        raise RunStateError(f"--resume: there is no run at {where} to resume; drop --resume to start it")
    if state.exists and not state.trained and (saved or {}).get("name") == wanted.get("name"):
        return StartPlan("restart", "starting again: the earlier start of this run stopped before it trained a step")
    if state.finished:
        raise RunStateError(
            f"run {name!r} already finished ({where}/final exists); choose another name "
            f"(name={name}-2) or delete {where}"
        )
    if state.exists and not resume:
        detail = f"checkpoints up to step {max(state.steps)}" if state.steps else "no checkpoint yet"
        raise RunStateError(
            f"run {name!r} already exists at {where} ({detail}); rerun with --resume to continue it, "
            f"or choose another name (name={name}-2)"
        )
    if not resume:
        return StartPlan("start", "new run")
    check_resumable(saved or {}, wanted, allowed=RESUMABLE_CHANGES + RETUNABLE_CHANGES if retune else None)
    return StartPlan("resume", _resume_reason(state))


def plan_stage_start(
    where: str,
    name: str,
    state: RunState,
    saved: dict[str, Any] | None,
    wanted: dict[str, Any],
    *,
    can_replace: bool,
) -> StartPlan:
    """``rayft run``'s train stage: keep, resume, replace or start the training run at ``where``.

    Args:
        where: The training run's location as it may be shown.
        name: The pipeline's name, for the fix in messages.
        state: What the store holds.
        saved: The config saved in the run (None when there is none).
        wanted: The train stage's config, as it is saved.
        can_replace: Whether the store can keep an earlier run aside (a local directory can, a URI cannot).

    Raises:
        RunStateError: the run holds other settings and cannot be replaced.
    """
    if state.exists and saved != wanted:
        if not can_replace:
            raise RunStateError(
                f"stage train: {where} holds a training run with other settings; choose another name "
                f"(name={name}-2) or delete it to train again"
            )
        return StartPlan("replace", "it holds a training run with other settings")
    if state.finished:
        return StartPlan("keep", "it already holds this training run, finished")
    if state.exists:
        return StartPlan("resume", _resume_reason(state))
    return StartPlan("start", "new run")


def check_resumable(saved: dict[str, Any], wanted: dict[str, Any], allowed: tuple[str, ...] | None = None) -> None:
    """Refuse a resume whose config differs from the saved one outside ``allowed`` (default
    :data:`RESUMABLE_CHANGES`)."""
    before, after = flatten(saved), flatten(wanted)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    blocking = [k for k in changed if not k.startswith(allowed or RESUMABLE_CHANGES)]
    if blocking:
        details = ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in blocking)
        raise ConfigError(
            f"--resume with a different config: {details}. Resume with the original settings, or start a new run "
            "under another name."
        )


def check_retunable(paths: list[str] | tuple[str, ...]) -> None:
    """Refuse config paths that a run cannot change while it continues from a checkpoint (what
    Population Based Training perturbs): only :data:`RETUNABLE_CHANGES` can be."""
    refused = [path for path in paths if path not in RETUNABLE_CHANGES]
    if refused:
        raise ConfigError(
            f"tune.pbt: {', '.join(refused)} cannot be perturbed: a trial that copies another's checkpoint keeps "
            f"its model, data and steps, so only optimiser settings may change ({', '.join(RETUNABLE_CHANGES)}). "
            "Search the others with scheduler asha, hyperband or fifo, or list only those in "
            "tune.pbt.hyperparam_mutations."
        )


def check_resume_data(checkpoint: str, recorded: str | None, prepared: str, policy: DataChange) -> str | None:
    """Whether a run may resume from ``checkpoint`` on the data prepared now: None when the keys agree
    (or the checkpoint recorded none), a warning to log when they differ and ``policy`` accepts it.

    Args:
        checkpoint: The checkpoint the run resumes from, as it may be shown.
        recorded: The prepared data's key the checkpoint recorded (its manifest's ``data_key``).
        prepared: The key of the data prepared for this start.
        policy: ``checkpoint.resume_data_change``.

    Raises:
        RunStateError: the data changed and ``policy`` is ``refuse``.
    """
    if recorded is None or recorded == prepared:
        return None
    what = (
        f"checkpoint {checkpoint} was trained on data {recorded[:12]}, but the config's data now prepares to "
        f"{prepared[:12]} (a dataset's rows changed since)"
    )
    if policy == "accept":
        return f"--resume: {what}; continuing on the new data (checkpoint.resume_data_change=accept)"
    raise RunStateError(
        f"--resume: {what}; resuming would train the rest of the run on other data. Restore the data it was "
        "trained on, start a new run under another name, or set checkpoint.resume_data_change=accept to continue "
        "on the new data"
    )


def _resume_reason(state: RunState) -> str:
    return f"resuming from step {max(state.steps)}" if state.steps else "resuming (no checkpoint yet)"


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{dotted.path: value}``."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}
