"""Config section for hyper-parameter search (`rayft tune`): the space, the metric, the scheduler."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_serializer, model_validator

from rayft.config.base import Section

DomainKind = Literal["loguniform", "uniform", "randint", "choice", "grid"]

# Domains with a [low, high] range; the rest hold a list of values.
RANGE_KINDS = ("loguniform", "uniform", "randint")
LIST_KINDS = ("choice", "grid")


class Domain(Section):
    """Where one hyper-parameter is drawn from, written as a one-key mapping.

    ``{loguniform: [1e-5, 1e-3]}``, ``{uniform: [0.0, 0.1]}``, ``{randint: [0, 50]}`` (low included,
    high excluded, as in Ray Tune), ``{choice: [8, 16, 32]}`` (sampled) or ``{grid: [8, 16, 32]}``
    (every value is run).
    """

    kind: DomainKind = Field(description="The kind of domain: loguniform, uniform, randint, choice or grid.")
    values: tuple[Any, ...] = Field(
        description="[low, high] for loguniform, uniform and randint; the values for choice and grid."
    )

    @model_validator(mode="before")
    @classmethod
    def _from_one_key(cls, data: Any) -> Any:
        if isinstance(data, dict) and set(data) - {"kind", "values"}:
            if len(data) != 1:
                raise ValueError(
                    f"a domain is a mapping with exactly one key (loguniform, uniform, randint, choice or grid), "
                    f"got {sorted(data)}; write e.g. {{loguniform: [1.0e-5, 1.0e-3]}}"
                )
            ((kind, values),) = data.items()
            data = {"kind": kind, "values": values}
        if isinstance(data, dict) and data.get("kind") in RANGE_KINDS and isinstance(data.get("values"), list):
            # YAML reads 1e-5 (no dot) as a string; a range bound is always a number.
            data = {**data, "values": [_number(v) for v in data["values"]]}
        return data

    @model_validator(mode="after")
    def _check_values(self) -> Domain:
        if self.kind in RANGE_KINDS:
            _check_range(self.kind, self.values)
        elif not self.values:
            raise ValueError(f"{self.kind} needs a non-empty list of values, e.g. {{{self.kind}: [8, 16, 32]}}")
        return self

    @model_serializer
    def _one_key(self) -> dict[str, list[Any]]:
        return {self.kind: list(self.values)}

    @property
    def is_grid(self) -> bool:
        """Whether every value is run (``grid``) rather than sampled."""
        return self.kind == "grid"


def _number(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _check_range(kind: str, values: tuple[Any, ...]) -> None:
    example = "[1.0e-5, 1.0e-3]" if kind == "loguniform" else "[0, 50]"
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(values) != 2 or len(numbers) != 2:
        raise ValueError(f"{kind} needs two numbers [low, high], got {list(values)}; write e.g. {{{kind}: {example}}}")
    low, high = numbers
    if not low < high:
        raise ValueError(f"{kind} needs low < high, got [{low}, {high}]; swap or widen the bounds")
    if kind == "loguniform" and low <= 0:
        raise ValueError(f"loguniform needs positive bounds, got [{low}, {high}]; use uniform for a range from 0")
    if kind == "randint" and not all(isinstance(v, int) or float(v).is_integer() for v in numbers):
        raise ValueError(f"randint needs whole-number bounds, got [{low}, {high}]")


class PbtConfig(Section):
    """Population Based Training: how often and how trials copy better ones and perturb their values."""

    perturbation_interval: int = Field(
        2,
        gt=0,
        description=(
            "Reports (evaluations) between two exploit/explore decisions of a trial. A trial must save a "
            "checkpoint at least this often to be copied; keep it a multiple of the evaluations per checkpoint."
        ),
    )
    quantile_fraction: float = Field(
        0.25,
        ge=0,
        le=0.5,
        description="Fraction of trials in the bottom quantile that copy one of the top quantile (0 to 0.5).",
    )
    resample_probability: float = Field(
        0.25,
        ge=0,
        le=1,
        description=(
            "Chance that an exploited value is drawn afresh from its domain instead of perturbed "
            "(multiplied by 0.8 or 1.2, or moved to a neighbouring choice)."
        ),
    )
    synch: bool = Field(
        False,
        description=(
            "Synchronous PBT: a trial that reaches a perturbation point waits (paused) until every live trial "
            "has reached it, then the bottom quantile copies the top one together. Decisions no longer depend "
            "on which trial happens to report first, at the cost of idle workers and a restart of every trial "
            "at each point. False: each trial is compared with the others' latest reports as it reports."
        ),
    )
    hyperparam_mutations: dict[str, Domain] | None = Field(
        None,
        description=(
            "Dotted config paths PBT may perturb, with their domains (no grid). Unset: every entry of "
            "tune.search_space."
        ),
    )

    @field_validator("hyperparam_mutations")
    @classmethod
    def _no_grid(cls, value: dict[str, Domain] | None) -> dict[str, Domain] | None:
        for path, domain in (value or {}).items():
            if domain.is_grid:
                raise ValueError(f"{path}: PBT cannot mutate a grid domain; use choice: {list(domain.values)}")
        return value


class TuneConfig(Section):
    """A hyper-parameter search (`rayft tune`): each trial is a full training run of this config with
    the sampled values set at their dotted paths."""

    name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description=(
            "Sweep name: its state and results live in <storage_path>/<name>/. Unset: '<name>-tune' after the run name."
        ),
    )
    metric: str = Field(
        "eval/loss",
        min_length=1,
        description=(
            "The reported metric trials are ranked (and early-stopped) on: eval/loss, train/loss, a custom "
            "task's eval/<name>, or eval_task/<name>, a metric of the evaluation task (eval.task) that each "
            "trial scores its checkpoints with, e.g. eval_task/accuracy_flexible (gsm8k) or "
            "eval_task/execution_accuracy (sql)."
        ),
    )
    mode: Literal["min", "max"] = Field("min", description="Whether a lower (min) or higher (max) metric is better.")
    num_samples: int = Field(
        8,
        gt=0,
        description=(
            "Trials to sample. With grid domains (Ray Tune's semantics) every grid point runs num_samples "
            "times, each with fresh draws for the other domains; with search_algorithm grid it defaults to 1, "
            "so each grid point runs once."
        ),
    )
    scheduler: Literal["fifo", "asha", "hyperband", "pbt"] = Field(
        "fifo",
        description=(
            "fifo runs every trial to the end; asha and hyperband stop poor trials early at rungs of "
            "grace_period * reduction_factor^k reports; pbt copies and perturbs good trials (see tune.pbt)."
        ),
    )
    search_algorithm: Literal["random", "grid", "optuna"] = Field(
        "random",
        description=(
            "random samples each domain (grid domains are crossed with the samples); grid runs every "
            "combination of grid and choice values (no continuous domains); optuna uses Optuna's TPE "
            "(pip install 'rayft[tune]'; no grid domains, not with pbt)."
        ),
    )
    search_space: dict[str, Domain] = Field(
        default_factory=dict,
        description=(
            "Dotted config path -> domain, e.g. train.learning_rate: {loguniform: [1.0e-5, 1.0e-3]}, "
            "lora.r: {choice: [8, 16, 32]}, train.warmup_steps: {randint: [0, 50]} (high excluded), "
            "train.micro_batch_size: {grid: [1, 2]}."
        ),
    )
    eval_rows: int | None = Field(
        None,
        gt=0,
        description=(
            "With an eval_task/<name> metric: the rows of eval.datasets each trial scores at every report "
            "(the first ones, after few-shot examples). Unset: eval.max_samples."
        ),
    )
    max_concurrent_trials: int | None = Field(
        None,
        gt=0,
        description="Upper bound on trials running at once. Unset: as many as the cluster holds (scaling per trial).",
    )
    grace_period: int = Field(
        1, gt=0, description="asha/hyperband: reports (evaluations) a trial makes before it can be stopped."
    )
    reduction_factor: int = Field(
        2, ge=2, description="asha/hyperband: 1/reduction_factor of the trials go on at each rung."
    )
    max_t: int | None = Field(
        None,
        gt=0,
        description=(
            "asha/hyperband: the most reports (evaluations) a trial makes. Unset: the number of evaluations "
            "one training run makes."
        ),
    )
    pbt: PbtConfig = Field(default_factory=PbtConfig, description="Population Based Training (scheduler: pbt).")
    seed: int | None = Field(
        None, ge=0, description="Seed of the search algorithm, so a sweep samples the same values again."
    )

    @model_validator(mode="before")
    @classmethod
    def _grid_runs_each_point_once(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("search_algorithm") == "grid" and "num_samples" not in data:
            return {**data, "num_samples": 1}
        return data

    @model_validator(mode="after")
    def _check_combination(self) -> TuneConfig:
        if not self.search_space:
            raise ValueError(
                "tune.search_space is empty; give at least one dotted path and its domain, "
                "e.g. train.learning_rate: {loguniform: [1.0e-5, 1.0e-3]}"
            )
        grids = [p for p, d in self.search_space.items() if d.is_grid]
        if self.search_algorithm == "grid":
            ranges = [p for p, d in self.search_space.items() if d.kind in RANGE_KINDS]
            if ranges:
                raise ValueError(
                    f"search_algorithm grid needs finite values, but {', '.join(ranges)} are ranges; "
                    "give them as grid: [...] values or use search_algorithm random"
                )
        if self.search_algorithm == "optuna" and grids:
            raise ValueError(
                f"search_algorithm optuna cannot run grid domains ({', '.join(grids)}); use choice: [...] instead"
            )
        if self.scheduler == "pbt":
            self._check_pbt()
        return self

    def _check_pbt(self) -> None:
        if self.search_algorithm == "optuna":
            raise ValueError("scheduler pbt picks its own values and cannot run with search_algorithm optuna")
        if self.pbt.hyperparam_mutations is None:
            grids = [p for p, d in self.search_space.items() if d.is_grid]
            if grids:
                raise ValueError(
                    f"scheduler pbt mutates tune.search_space, whose {', '.join(grids)} are grid domains; "
                    "give tune.pbt.hyperparam_mutations or use choice: [...]"
                )

    @property
    def mutations(self) -> dict[str, Domain]:
        """What PBT perturbs: ``pbt.hyperparam_mutations``, else the whole search space."""
        return self.pbt.hyperparam_mutations if self.pbt.hyperparam_mutations is not None else self.search_space

    def sweep_name(self, run_name: str) -> str:
        """The sweep's name: ``name``, else ``<run name>-tune``."""
        return self.name or f"{run_name}-tune"
