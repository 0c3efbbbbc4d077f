"""Which deployment serves which model id (pure: reads the sources' files, loads no model).

Every source gets a model id: a model name as given; a directory by its name, or
``<run>/<checkpoint>`` for ``step-N`` and ``final`` directories; a pipeline run directory
(``rayft run``'s output) serves its final model (the preference-trained one when the pipeline
trained one) under the run's name. LoRA adapters trained on the same
base model share that base's deployment (one replica set, the adapter chosen per request); the base
is served under its own name beside them. A full checkpoint or an export is a base of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rayft.config.model import ModelConfig
from rayft.errors import ConfigError
from rayft.models.sources import ResolvedSource, resolve_source
from rayft.runs import layout
from rayft.runs.checkpoints import is_pipeline_dir, trained_run_of_pipeline


@dataclass(frozen=True)
class Adapter:
    """One LoRA adapter served on a base: its model id, directory and the chat template it was trained with."""

    model_id: str
    path: str
    chat_template: str | None = None


@dataclass(frozen=True)
class BaseGroup:
    """One deployment: a base model, served as ``model_id``, and the adapters applied on it."""

    model_id: str
    model: ModelConfig
    adapters: tuple[Adapter, ...] = ()

    def ids(self) -> list[str]:
        """The model ids this deployment answers: the base first, then its adapters."""
        return [self.model_id, *(a.model_id for a in self.adapters)]


@dataclass(frozen=True)
class ServePlan:
    """The deployments of one ``rayft serve``, and the id -> (deployment index, adapter) table."""

    groups: tuple[BaseGroup, ...]
    routes: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    served_from: dict[str, str] = field(default_factory=dict)
    """What each source's model id serves: the directory or model name it loads."""

    @property
    def model_ids(self) -> list[str]:
        """Every served model id, in the order of the groups."""
        return [model_id for group in self.groups for model_id in group.ids()]


def model_id_of(source: str) -> str:
    """The model id a source is served as."""
    path = Path(source).expanduser()
    if not path.is_dir():
        return source
    path = path.resolve()
    if path.name == "final" or (path.name.startswith("step-") and path.parent.name == "checkpoints"):
        run = path.parent.parent if path.parent.name == "checkpoints" else path.parent
        return f"{run.name}/{path.name}"
    return path.name


def plan_serving(sources: list[str], default_model: ModelConfig, checkpoint: str = "latest") -> ServePlan:
    """Resolve every source and group the adapters by base model."""
    if not sources:
        raise ConfigError(
            "rayft serve needs at least one SOURCE (a run directory, checkpoint, export or model name); give it on "
            "the command line or in serve.sources"
        )
    named = [_named_source(s) for s in sources]
    resolved = [(model_id, resolve_source(path, default_model, checkpoint)) for model_id, path in named]
    _check_unique([model_id for model_id, _ in resolved], sources)
    groups: dict[str, BaseGroup] = {}
    for model_id, source in resolved:
        _add(groups, model_id, source)
    ordered = tuple(groups.values())
    _check_unique([i for g in ordered for i in g.ids()], sources)
    routes = {
        model_id: (index, None if model_id == group.model_id else model_id)
        for index, group in enumerate(ordered)
        for model_id in group.ids()
    }
    return ServePlan(ordered, routes, dict(named))


def _named_source(source: str) -> tuple[str, str]:
    """A source's model id and what it loads: a pipeline directory names its final model."""
    path = Path(source).expanduser()
    if not (path.is_dir() and is_pipeline_dir(path)):
        return model_id_of(source), source
    run = trained_run_of_pipeline(path)
    if run is None:
        raise ConfigError(
            f"{source} is a pipeline run that has trained no model yet (no finished train, preference or rl stage); "
            "serve it once `rayft run` has trained, or give a checkpoint or model"
        )
    return path.resolve().name, str(run / layout.FINAL_DIR)


def _add(groups: dict[str, BaseGroup], model_id: str, source: ResolvedSource) -> None:
    if source.kind != "lora" or source.adapter_path is None:
        groups.setdefault(source.model.name, BaseGroup(model_id, source.model))
        return
    _refuse_rewritten_base(model_id, Path(source.adapter_path))
    # Adapters of one base share its deployment whatever template each was trained with; the
    # template travels with the adapter and renders its requests.
    base = source.model.model_copy(update={"chat_template": None})
    group = groups.get(base.name) or BaseGroup(base_model_id(base), base)
    adapter = Adapter(model_id, source.adapter_path, source.model.chat_template)
    groups[base.name] = BaseGroup(group.model_id, group.model, (*group.adapters, adapter))


def _refuse_rewritten_base(model_id: str, adapter_dir: Path) -> None:
    """An adapter initialised by PiSSA or OLoRA works on its base less the base's top-r part, which PEFT writes
    into the base when it loads the adapter: the base and every other adapter of the deployment would then
    answer from the rewritten weights."""
    config = adapter_dir / layout.ADAPTER_CONFIG
    init = json.loads(config.read_text(encoding="utf-8")).get("init_lora_weights") if config.is_file() else None
    if init in ("pissa", "olora"):
        raise ConfigError(
            f"{model_id}: its adapter was initialised by {init} (lora.init), which rewrites the base weights that "
            "the served base model and its other adapters share; export it merged (rayft export) and serve that "
            "directory"
        )


def base_model_id(model: ModelConfig) -> str:
    """The id a base model is served under: its name, or a local directory's name."""
    return model_id_of(model.name) if Path(model.name).expanduser().is_dir() else model.name


def _check_unique(ids: list[str], sources: list[str]) -> None:
    seen: set[str] = set()
    for model_id in ids:
        if model_id in seen:
            raise ConfigError(
                f"two sources would be served as model id {model_id!r} (sources: {', '.join(sources)}); "
                "give each run or checkpoint once, or copy one under another directory name"
            )
        seen.add(model_id)
