"""The search space: checking its dotted paths against the config tree, applying sampled values to a
config, and turning domains into Ray Tune's objects.

Everything but :func:`to_ray_space` and :func:`to_ray_mutations` is pure and imports no Ray.
"""

from __future__ import annotations

import difflib
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from rayft.config.loader import set_dotted, validate_config
from rayft.config.schema import RayftConfig
from rayft.config.tune import Domain, TuneConfig
from rayft.errors import ConfigError

# Paths a trial must not change, with why: they name or place the sweep, or configure it.
_FROZEN = {
    "name": "each trial's run name is set by the sweep",
    "storage_path": "every trial writes under the sweep's storage path",
    "tune": "the sweep's own settings are not a trial's hyper-parameters",
    "scaling": "every trial runs on the same workers, which the sweep plans its concurrency for",
    "k8s": "deployment manifests do not change a training run",
}


def check_search_space(cfg: RayftConfig) -> None:
    """Check ``cfg.tune``'s search space (and PBT's mutations) before anything starts.

    Every dotted path must name a config field that a trial may change, and every value a domain can
    produce (both bounds of a range, a value inside it, every choice) must validate at that path.

    Raises:
        ConfigError: listing every problem, each with the path, the bad value and the fix.
    """
    if cfg.tune is None:
        raise ConfigError("the config has no tune: section; add one with a search_space to run a sweep")
    where = {"tune.search_space": cfg.tune.search_space}
    if cfg.tune.scheduler == "pbt" and cfg.tune.pbt.hyperparam_mutations is not None:
        where["tune.pbt.hyperparam_mutations"] = cfg.tune.pbt.hyperparam_mutations
    problems = [
        problem
        for section, space in where.items()
        for path, domain in space.items()
        for problem in _domain_problems(cfg, f"{section}[{path!r}]", path, domain)
    ]
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"Invalid search space, {len(problems)} problem(s):\n{lines}")


def _domain_problems(cfg: RayftConfig, label: str, path: str, domain: Domain) -> list[str]:
    problem = path_problem(path)
    if problem:
        return [f"{label}: {problem}"]
    problems = []
    for value in sample_points(domain):
        try:
            apply_params(cfg, {path: value})
        except ConfigError as exc:
            reason = str(exc).split("\n", 1)[-1].strip().removeprefix("- ")
            fix = _continuous_fix(domain) if isinstance(value, float) and not value.is_integer() else ""
            problems.append(f"{label}: the {domain.kind} value {value!r} is invalid there: {reason}{fix}")
    return problems


def _continuous_fix(domain: Domain) -> str:
    if domain.kind not in ("uniform", "loguniform"):
        return ""
    low, high = domain.values
    return f" (for a whole-number field use randint: [{math.ceil(low)}, {math.floor(high) + 1}] or choice: [...])"


def path_problem(path: str) -> str:
    """Why ``path`` cannot be tuned ('' when it can): not a config field, or one a trial must not change."""
    top = path.split(".", 1)[0]
    if top in _FROZEN:
        return f"{path!r} cannot be tuned: {_FROZEN[top]}; remove it from the search space"
    model: Any = RayftConfig
    for depth, part in enumerate(path.split(".")):
        if typing.get_origin(model) is list and part.isdigit():
            model = _section_type(typing.get_args(model)[0])
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return _unknown_path(path, depth)
        model = _section_type(model.model_fields[part].annotation)
    return ""


def _unknown_path(path: str, depth: int) -> str:
    guesses = difflib.get_close_matches(path, tunable_paths(), n=3, cutoff=0.6)
    if not guesses:
        leaf = path.rsplit(".", 1)[-1]
        guesses = [p for p in tunable_paths() if p.rsplit(".", 1)[-1] == leaf][:3]
    hint = f"did you mean {' or '.join(guesses)}?" if guesses else "see `rayft config show` for the field paths"
    return f"{path!r} is no config field ({'.'.join(path.split('.')[: depth + 1])!r} does not exist); {hint}"


def _section_type(annotation: Any) -> Any:
    """The section class of a field (through Optional), else the annotation itself."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


@functools.cache
def tunable_paths() -> tuple[str, ...]:
    """Every dotted path of a leaf config field that a trial may change."""
    return tuple(p for p in _leaf_paths(RayftConfig, "") if p.split(".", 1)[0] not in _FROZEN)


def _leaf_paths(model: type[BaseModel], prefix: str) -> list[str]:
    paths: list[str] = []
    for name, field in model.model_fields.items():
        inner = _section_type(field.annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            paths += _leaf_paths(inner, f"{prefix}{name}.")
        else:
            paths.append(f"{prefix}{name}")
    return paths


def sample_points(domain: Domain) -> list[Any]:
    """The values that stand for everything a domain can produce: both ends of a range (randint's
    last value, since its high is excluded) and a value inside it; every value of a list."""
    if domain.kind == "randint":
        low, high = (int(v) for v in domain.values)
        return [low, high - 1]
    if domain.kind == "uniform":
        low, high = domain.values
        return [float(low), low + (high - low) * 0.37, float(high)]
    if domain.kind == "loguniform":
        low, high = domain.values
        return [float(low), math.exp(math.log(low) + (math.log(high) - math.log(low)) * 0.37), float(high)]
    return list(domain.values)


def apply_params(cfg: RayftConfig, params: Mapping[str, Any]) -> RayftConfig:
    """A validated copy of ``cfg`` with each dotted path in ``params`` set to its value.

    Raises:
        ConfigError: a path is not in the config, or a value does not validate there.
    """
    raw = cfg.model_dump(mode="json", exclude_unset=False)
    for path, value in params.items():
        set_dotted(raw, path, _plain(value))
    return validate_config(raw, source=f"{cfg.name} with {dict(params)}")


def _plain(value: Any) -> Any:
    """Numpy scalars (what Ray's samplers return) as Python numbers."""
    item = getattr(value, "item", None)
    return item() if callable(item) and not isinstance(value, (list, dict, str)) else value


def count_trials(tune: TuneConfig) -> int:
    """How many trials a sweep runs: ``num_samples`` times the number of grid points (with
    ``search_algorithm: grid`` choice domains are grid axes too)."""
    points = 1
    for domain in tune.search_space.values():
        if domain.is_grid or (tune.search_algorithm == "grid" and domain.kind == "choice"):
            points *= len(domain.values)
    return tune.num_samples * points


def to_ray_space(tune: TuneConfig) -> dict[str, Any]:
    """The search space as a Ray Tune ``param_space``, keyed by dotted path."""
    grid_choices = tune.search_algorithm == "grid"
    return {path: _ray_domain(domain, grid_choices) for path, domain in tune.search_space.items()}


def to_ray_mutations(tune: TuneConfig) -> dict[str, Any]:
    """PBT's ``hyperparam_mutations``: choices as lists (perturbed to a neighbouring value), ranges as
    Ray domains (perturbed by a factor of 0.8 or 1.2, or resampled)."""
    return {
        path: list(domain.values) if domain.kind == "choice" else _ray_domain(domain, False)
        for path, domain in tune.mutations.items()
    }


def _ray_domain(domain: Domain, grid_choices: bool) -> Any:
    from ray import tune

    values = list(domain.values)
    if domain.kind == "loguniform":
        return tune.loguniform(values[0], values[1])
    if domain.kind == "uniform":
        return tune.uniform(values[0], values[1])
    if domain.kind == "randint":
        return tune.randint(int(values[0]), int(values[1]))
    if domain.kind == "grid" or grid_choices:
        return tune.grid_search(values)
    return tune.choice(values)
