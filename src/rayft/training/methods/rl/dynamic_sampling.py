"""DAPO's dynamic sampling (``train.rl.dynamic_sampling``): a step trains only on informative groups, those
whose rewards differ (a group scored alike has advantage 0 everywhere and teaches nothing), and samples more
prompts until it holds the configured number of them, within a bound on extra sampling rounds.

The extra prompts come from a second stream over the worker's own shard (:class:`RefillStream`), in an
order of its own (seeded by the run's seed, a pass number and the rank, as the main stream's epochs are) and
read from a cursor that checkpoints keep: the main stream's place stays a function of the step (the loop's
exact resume is untouched), and a run resumed after steps that refilled draws the same extra prompts as the
uninterrupted run. Each extra micro-batch is sampled with a seed of its own (:func:`refill_seed`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from rayft.config.rl import DynamicSamplingConfig, RlConfig
from rayft.evaluation.rewards import Scores
from rayft.training.loop.batches import Unit, shuffled_units
from rayft.training.methods.rl.layered_state import unwrapped_state, wrapped_state
from rayft.training.methods.rl.sampling import Completions, PromptBatch, seed_of

if TYPE_CHECKING:
    from collections.abc import Sequence

REFILL_EPOCH = 1 << 20
"""Epoch numbers of the refill stream's passes start here, far from the main stream's (a run of a million
epochs is not one anybody starts), so its orders are never the main stream's."""


@dataclass
class Scored:
    """Scored completions of prompts: ``group`` consecutive completions per prompt, with the shaped rewards
    the advantages are computed from (``rewards``: the total plus any overlong punishment)."""

    batch: PromptBatch
    completions: Completions
    scores: Scores
    rewards: list[float]

    def groups(self, group: int) -> list[Scored]:
        """One :class:`Scored` per prompt, in order."""
        return [self.one(index, group) for index in range(len(self.batch.prompts))]

    def one(self, index: int, group: int) -> Scored:
        """The ``index``-th prompt's group."""
        part = slice(index * group, (index + 1) * group)
        b, c, s = self.batch, self.completions, self.scores
        batch = PromptBatch([b.prompts[index]], [b.references[index]], [b.sample_ids[index]],
                            [b.rows[index]] if b.rows else [])  # fmt: skip
        ids = c.token_ids[part]
        completions = Completions(ids, c.texts[part], sum(len(t) for t in ids), 0.0, c.version,
                                  None if c.logps is None else c.logps[part])  # fmt: skip
        scores = Scores(s.total[part], {name: v[part] for name, v in s.by_function.items()},
                        dict.fromkeys(s.errors, 0))  # fmt: skip
        return Scored(batch, completions, scores, self.rewards[part])

    @property
    def informative(self) -> bool:
        """Whether the rewards differ (a group of one prompt): its advantages are not all 0."""
        return max(self.rewards) != min(self.rewards)


def merged(groups: Sequence[Scored]) -> Scored:
    """Groups of prompts as one :class:`Scored` (in order)."""
    first = groups[0]
    rows = [row for g in groups for row in g.batch.rows]
    batch = PromptBatch([p for g in groups for p in g.batch.prompts], [r for g in groups for r in g.batch.references],
                        [i for g in groups for i in g.batch.sample_ids], rows)  # fmt: skip
    logps = None if first.completions.logps is None else [lp for g in groups for lp in g.completions.logps or []]
    ids = [t for g in groups for t in g.completions.token_ids]
    completions = Completions(ids, [t for g in groups for t in g.completions.texts], sum(len(t) for t in ids), 0.0,
                              first.completions.version, logps)  # fmt: skip
    names = first.scores.by_function
    scores = Scores([t for g in groups for t in g.scores.total],
                    {n: [v for g in groups for v in g.scores.by_function[n]] for n in names},
                    dict.fromkeys(first.scores.errors, 0))  # fmt: skip
    return Scored(batch, completions, scores, [r for g in groups for r in g.rewards])


@dataclass
class RefillRecord:
    """What dynamic sampling did in one step on one worker: groups drawn (first sampling and extra), dropped
    (rewards all equal), trained, the extra completions sampled, the extra rounds, and whether the step ran
    short of its target of informative groups (each field the sum its figure rl/<name> adds up)."""

    groups_drawn: int = 0
    groups_dropped: int = 0
    groups_trained: int = 0
    extra_rollouts: int = 0
    refill_rounds: int = 0
    short_steps: int = 0


RECORD_FIGURES = ("groups_drawn", "groups_dropped", "groups_trained", "extra_rollouts", "refill_rounds", "short_steps")


def record_figures(total: dict[str, float], completions: float, settings: RlConfig) -> dict[str, float]:
    """The step figures of a curriculum (prompts every completion solved, and none did), truncation and the
    overlong punishment, and dynamic sampling's record, from the sums ``total`` over every worker since the
    last figures (``completions``: how many were sampled)."""
    figures = {"rl/prompts_all_solved": total["prompts_all_solved"],
               "rl/prompts_none_solved": total["prompts_none_solved"],
               "rl/truncated": total["truncated"] / completions}  # fmt: skip
    if settings.overlong_buffer is not None:
        figures["rl/overlong_penalty"] = total["overlong_penalty"] / completions
    if settings.dynamic_sampling is not None:
        figures.update({f"rl/{name}": total[name] for name in RECORD_FIGURES})
    return figures


def informative_groups(
    first: Sequence[Scored], *, target: int, group: int, max_rounds: int, draw: Callable[[int], list[Scored]]
) -> tuple[list[Scored], RefillRecord]:
    """Up to ``target`` informative groups (one prompt each, in the order drawn): those of ``first`` (the
    step's own prompts), then those of extra rounds ``draw(1)``, ``draw(2)``, ... until ``target`` are held or
    ``max_rounds`` extra rounds ran. Groups past the target are dropped unused, as DAPO drops them."""
    record = RefillRecord()
    kept: list[Scored] = []

    def take(pieces: Sequence[Scored]) -> None:
        for piece in pieces:
            for one in piece.groups(group):
                record.groups_drawn += 1
                if one.informative:
                    kept.append(one)
                else:
                    record.groups_dropped += 1

    take(first)
    while len(kept) < target and record.refill_rounds < max_rounds:
        record.refill_rounds += 1
        extra = draw(record.refill_rounds)
        record.extra_rollouts += sum(len(piece.completions.token_ids) for piece in extra)
        take(extra)
    record.short_steps = int(len(kept) < target)
    record.groups_trained = min(len(kept), target)
    return kept[:target], record


def refilled(
    scored: list[Scored], stream: RefillStream, settings: DynamicSamplingConfig, *, group: int, micro_batch: int,
    sample: Callable[[list[Unit], int], Scored],
) -> tuple[list[Scored], bool, RefillRecord]:  # fmt: skip
    """A step's informative groups in micro-batches of ``micro_batch`` prompts, as many as the step's prompts
    (``scored``) where the bound allows: each extra round draws prompts from ``stream`` and has them sampled
    and scored by ``sample(units, round)`` a micro-batch at a time. With none at all, one dropped group in
    their place (True), which a step trains with weight 0 so that every worker still takes part in it."""
    target = sum(len(piece.batch.prompts) for piece in scored)

    def draw(round_: int) -> list[Scored]:
        units = stream.draw(settings.prompts_per_round or target)
        return [sample(units[start : start + micro_batch], round_) for start in range(0, len(units), micro_batch)]

    kept, record = informative_groups(scored, target=target, group=group, max_rounds=settings.max_rounds, draw=draw)
    if not kept:
        return [scored[0].one(0, group)], True, record
    return [merged(kept[i : i + micro_batch]) for i in range(0, len(kept), micro_batch)], False, record


def refill_seed(seed: int, step: int, round_: int, sample_id: int) -> int:
    """The sampling seed of an extra micro-batch: a function of the run seed, the step, the round and its
    first prompt's sample id, apart from the main stream's seeds (the same prompt may be drawn by both)."""
    return seed_of(seed + 7_919 * round_, step, sample_id)


@dataclass
class RefillStream:
    """The extra prompts of a worker: endless passes over its shard, each in an order seeded by (run seed,
    :data:`REFILL_EPOCH` + pass, rank), read from a checkpointed cursor (``passes``, ``position``)."""

    windows: Callable[[], Iterator[list[Unit]]]
    seed: int
    rank: int
    passes: int = 0
    position: int = 0
    _units: Iterator[Unit] | None = field(default=None, repr=False)

    def draw(self, count: int) -> list[Unit]:
        """The next ``count`` units (a pass that ends starts the next one); fewer only from an empty shard."""
        out: list[Unit] = []
        empty_passes = 0
        while len(out) < count and empty_passes < 2:
            got = list(islice(self.units(), count - len(out)))
            self.position += len(got)
            out += got
            if len(out) < count:
                empty_passes = empty_passes + 1 if not got else 0
                self.passes, self.position, self._units = self.passes + 1, 0, None
        return out

    def units(self) -> Iterator[Unit]:
        """The current pass from the cursor on."""
        if self._units is None:
            ordered = shuffled_units(self.windows(), self.seed, REFILL_EPOCH + self.passes, self.rank)
            self._units = islice(ordered, self.position, None)
        return self._units

    def state(self) -> dict[str, int]:
        """The cursor, for a checkpoint."""
        return {"passes": self.passes, "position": self.position}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's cursor."""
        self.passes, self.position, self._units = int(state["passes"]), int(state["position"]), None


STATE_KEY = "dynamic_sampling"


def packed_state(rollouts: str | None, stream: RefillStream) -> str:
    """A rank's checkpointed state with dynamic sampling: the rollouts' own (if any) and the refill cursor."""
    return wrapped_state(STATE_KEY, stream.state(), rollouts, inner_key="rollouts")


def unpacked_state(text: str | None) -> tuple[str | None, dict[str, Any] | None]:
    """The rollouts' state and the refill cursor of :func:`packed_state` (a checkpoint written without
    dynamic sampling: its text is the rollouts' own, and no cursor)."""
    return unwrapped_state(STATE_KEY, text, inner_key="rollouts")
