"""Where the environment answers the model's turns during multi-turn rollouts: apart from the sampling, every
live episode's step at once, each waited on by itself within a deadline.

On Ray, the steps run on one threaded actor of the sampling process's own (no CPUs reserved: it must not
wait for CPUs the training workers hold; the tools' own limits and the per-call timeout bound its work), so
a slow tool holds only its own episode, and an environment whose step never returns is given up at the
deadline, its episode ended and counted, and the actor replaced (which ends the hung call with it). Without
Ray (a run in one process) the steps run on daemon threads, given up the same way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rayft.environments.episode import Environment, StepResult

if TYPE_CHECKING:
    import ray

STEP_ACTOR_THREADS = 64
"""Concurrent steps on one step actor; steps past it wait for a thread (within the same deadline)."""


@dataclass(frozen=True)
class StepOutcome:
    """One episode's step: the environment after it, its answer (None when it failed or ran out of time), why
    it failed (``timeout``, or the exception's one line) and its seconds."""

    env: Environment
    result: StepResult | None
    failure: str | None
    seconds: float


class StepRunner(Protocol):
    """Runs the environments' steps of one turn concurrently, none past ``timeout_s``."""

    def step(self, envs: Sequence[Environment], turns: Sequence[str], timeout_s: float) -> list[StepOutcome]:
        """Each environment's answer to its episode's turn, in order."""
        ...

    def close(self) -> None:
        """Release what the runner holds."""
        ...


def run_step(env: Environment, turn: str) -> tuple[Environment, StepResult | None, str | None, float]:
    """One step where it runs (an actor thread, or a local thread): the environment's failure is its answer."""
    started = time.perf_counter()
    try:
        result: StepResult | None = env.step(turn)
        failure = None
    except Exception as exc:  # a user's environment: its failure ends the episode, not the run
        result, failure = None, f"{type(exc).__name__}: {exc}"[:500]
    return env, result, failure, time.perf_counter() - started


class StepActor:
    """The Ray actor that runs steps on its threads (``max_concurrency``)."""

    def step(self, env: Environment, turn: str) -> tuple[Environment, StepResult | None, str | None, float]:
        """:func:`run_step` here."""
        return run_step(env, turn)


@dataclass
class RayStepRunner:
    """Steps on a threaded Ray actor, started at the first turn and replaced after a step that hung."""

    actor: Any = None

    def step(self, envs: Sequence[Environment], turns: Sequence[str], timeout_s: float) -> list[StepOutcome]:
        """Every step submitted at once; those unfinished at the deadline are given up."""
        import ray

        if self.actor is None:
            remote: Any = ray.remote(StepActor).options(num_cpus=0, max_concurrency=STEP_ACTOR_THREADS,
                                                        scheduling_strategy="DEFAULT")  # fmt: skip
            self.actor = remote.remote()
        refs = [self.actor.step.remote(env, turn) for env, turn in zip(envs, turns, strict=True)]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        finished = set(done)
        out = [self._outcome(env, ref, timeout_s) if ref in finished else StepOutcome(env, None, "timeout", timeout_s)
               for env, ref in zip(envs, refs, strict=True)]  # fmt: skip
        if len(finished) < len(refs):
            self.close()  # the hung steps end with their actor; the next turn starts a fresh one
        return out

    @staticmethod
    def _outcome(env: Environment, ref: ray.ObjectRef[Any], timeout_s: float) -> StepOutcome:
        import ray
        from ray.exceptions import RayError

        try:
            new_env, result, failure, seconds = ray.get(ref)
        except RayError as exc:  # the environment could not travel (not picklable) or the actor died
            return StepOutcome(env, None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}", timeout_s)
        return StepOutcome(new_env, result, failure, seconds)

    def close(self) -> None:
        """End the step actor (and any step still running on it)."""
        import ray

        if self.actor is not None:
            ray.kill(self.actor)
            self.actor = None


@dataclass
class ThreadStepRunner:
    """Steps on daemon threads of this process (a thread cannot be killed: a hung step keeps its thread)."""

    def step(self, envs: Sequence[Environment], turns: Sequence[str], timeout_s: float) -> list[StepOutcome]:
        """Every step started at once; those unfinished at the deadline are given up."""
        boxes: list[dict[str, Any]] = [{} for _ in envs]
        threads = [threading.Thread(target=_into, args=(env, turn, box), daemon=True, name="episode-step")
                   for env, turn, box in zip(envs, turns, boxes, strict=True)]  # fmt: skip
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        return [StepOutcome(*box["value"]) if "value" in box else StepOutcome(env, None, "timeout", timeout_s)
                for env, box in zip(envs, boxes, strict=True)]  # fmt: skip

    def close(self) -> None:
        """Nothing to release."""


def _into(env: Environment, turn: str, box: dict[str, Any]) -> None:
    box["value"] = run_step(env, turn)


def step_runner() -> StepRunner:
    """A runner on Ray when this process is connected to it, else on threads."""
    import ray

    return RayStepRunner() if ray.is_initialized() else ThreadStepRunner()
