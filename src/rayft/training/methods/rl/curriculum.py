"""A curriculum from SDG (``train.rl.curriculum``): after each step, a prompt every completion solved gets a
harder variant and a prompt none solved an easier one, and the variants are served in later steps.

A variant is written by SDG's symbolic generator (:mod:`rayft.sdg.symbolic`): the prompt's reference must be
an annotated solution (GSM8K's ``<<48/2=24>>`` steps and ``#### 24``), whose chain is re-computed exactly with
new numbers (harder: the numbers times ``harder_scale``, easier: divided by ``easier_divisor``, each drawn near
that), and the prompt's text rewritten with them; a row the generator cannot read is counted, not varied. A
variant sharing a word n-gram with an evaluation problem is discarded (SDG's decontamination check).

Variants wait in a bounded first-in first-out queue on each worker and take the place of a step's last prompts
before they are sampled. Every draw is seeded by (run seed, rank, step, place in the step), so a variant is a
function of what the step saw, and the queue, with the count of variants made (their sample ids), is kept in
checkpoints (:func:`packed_state`): a resumed run serves what the uninterrupted run would.

The planner here is pure (prompts as text through a :class:`Codec`); the method hands it the scored groups.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rayft.config.rl import CurriculumConfig
from rayft.sdg.dedup import NgramIndex
from rayft.sdg.seeds import read_eval_questions
from rayft.sdg.symbolic import UnusableSeedError, analyze_seed, make_variation
from rayft.training.methods.rl.layered_state import unwrapped_state, wrapped_state
from rayft.training.methods.rl.sampling import PromptBatch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Kind = Literal["harder", "easier"]

VARIANT_IDS = 1 << 40
"""Sample ids of variants start here, far above any dataset's row index, so a variant's id (which seeds its
micro-batch's sampling when it comes first) is never a row's."""

COUNTS = ("harder_added", "easier_added", "served", "not_rewritable", "no_draw", "leaked", "dropped")
FIGURES = (*(f"curriculum/{name}" for name in COUNTS), "curriculum/queue")
"""The sums the method reduces over ranks (rl/curriculum/<name>); the queue is each rank's length, summed."""


class Codec(Protocol):
    """Prompt token ids to text and back (the run's tokenizer, special tokens kept as text)."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``."""
        ...

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, adding no special tokens."""
        ...


@dataclass(frozen=True)
class Variant:
    """A queued prompt: its token ids, reference (the re-computed solution), the parent row's carried columns
    (None when the run carries none), its sample id and which kind it is."""

    prompt: list[int]
    reference: str
    row: dict[str, Any] | None
    sample_id: int
    kind: Kind


@dataclass
class Record:
    """What the curriculum did on one worker since the last figures (each field the sum of its figure)."""

    harder_added: int = 0
    easier_added: int = 0
    served: int = 0
    not_rewritable: int = 0
    no_draw: int = 0
    leaked: int = 0
    dropped: int = 0


def wanted(solved: Sequence[bool], settings: CurriculumConfig) -> Kind | None:
    """The variant a group's prompt asks for: harder when every completion solved it, easier when none did."""
    if solved and all(solved):
        return "harder" if settings.harder else None
    if not any(solved):
        return "easier" if settings.easier else None
    return None


def variant_text(
    question: str, reference: str, kind: Kind, settings: CurriculumConfig, rng: random.Random
) -> tuple[str, str] | str:
    """The (prompt text, reference) of a ``kind`` variant, or why there is none: 'not_rewritable' (no annotated
    solution the generator can vary) or 'no_draw' (no draw within max_attempts kept every result exact)."""
    try:
        chain = analyze_seed(question, reference)
    except UnusableSeedError:
        return "not_rewritable"
    scale: int | Fraction = settings.harder_scale if kind == "harder" else Fraction(1, settings.easier_divisor)
    made = make_variation(chain, rng, settings.max_attempts, scale)
    return "no_draw" if made is None else made


def draw_rng(seed: int, rank: int, step: int, place: int) -> random.Random:
    """The generator of one variant: a function of the run seed, the rank, the step and its place in the step
    (a string seed is hashed the same way in every process, unlike hash())."""
    return random.Random(f"curriculum:{seed}:{rank}:{step}:{place}")


@dataclass
class Curriculum:
    """One worker's curriculum: the queue of variants and what it did since the last figures."""

    settings: CurriculumConfig
    codec: Codec
    seed: int
    rank: int
    leaks: NgramIndex | None = None
    queue: deque[Variant] = field(default_factory=deque)
    made: int = 0  # variants made so far on this worker (their sample ids)
    record: Record = field(default_factory=Record)

    @classmethod
    def build(cls, settings: CurriculumConfig, codec: Codec, seed: int, rank: int) -> Curriculum:
        """The curriculum with its evaluation sets read (a bad set is a DataError at start)."""
        check = settings.decontamination
        questions = read_eval_questions(check) if check.datasets else []
        leaks = NgramIndex(questions, n=check.ngram_words, mask_numbers=check.mask_numbers) if questions else None
        return cls(settings, codec, seed, rank, leaks)

    def observe(self, groups: Sequence[tuple[PromptBatch, Sequence[bool]]], step: int) -> None:
        """Queue variants of a step's prompts: each ``(batch, solved)`` is one micro-batch and, per completion in
        prompt order, whether it solved its prompt; up to max_per_step variants, in the prompts' order."""
        tried = 0
        for batch, solved in groups:
            group = len(solved) // max(len(batch.prompts), 1)
            for index in range(len(batch.prompts)):
                kind = wanted(solved[index * group : (index + 1) * group], self.settings)
                if kind is None or tried >= self.settings.max_per_step:
                    continue
                tried += 1
                self.vary(batch, index, kind, draw_rng(self.seed, self.rank, step, tried))

    def vary(self, batch: PromptBatch, index: int, kind: Kind, rng: random.Random) -> None:
        """Queue a ``kind`` variant of the batch's ``index``-th prompt, or count why there is none."""
        made = variant_text(self.codec.decode(batch.prompts[index]), batch.references[index], kind, self.settings, rng)
        if isinstance(made, str):
            setattr(self.record, made, getattr(self.record, made) + 1)
            return
        question, reference = made
        if self.leaks is not None and self.leaks.overlap(question) is not None:
            self.record.leaked += 1
            return
        row = batch.rows[index] if batch.rows else None
        self.push(Variant(self.codec.encode(question), reference, row, VARIANT_IDS + self.made, kind))
        self.made += 1
        setattr(self.record, f"{kind}_added", getattr(self.record, f"{kind}_added") + 1)

    def push(self, variant: Variant) -> None:
        """Queue a variant, dropping the oldest when the queue is full."""
        if len(self.queue) >= self.settings.queue_size:
            self.queue.popleft()
            self.record.dropped += 1
        self.queue.append(variant)

    def serve(self, batches: list[PromptBatch]) -> list[PromptBatch]:
        """The step's micro-batches with up to serve_per_step queued variants (oldest first) in place of the
        step's last prompts."""
        prompts = sum(len(b.prompts) for b in batches)
        count = min(self.settings.serve_per_step, len(self.queue), prompts)
        if count == 0:
            return batches
        served = [self.queue.popleft() for _ in range(count)]
        self.record.served += count
        return with_variants(batches, served)

    def take_sums(self, sums: dict[str, float]) -> None:
        """Add the record since the last call to a method's figure ``sums`` and reset it; the queue's length is
        set (a level, not a count)."""
        for name, value in asdict(self.record).items():
            sums[f"curriculum/{name}"] = sums.get(f"curriculum/{name}", 0.0) + value
        sums["curriculum/queue"] = float(len(self.queue))
        self.record = Record()

    def state(self) -> dict[str, Any]:
        """The queue and the count of variants made, for a checkpoint."""
        return {"made": self.made, "queue": [asdict(v) for v in self.queue]}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's queue."""
        self.made = int(state["made"])
        self.queue = deque(Variant(**v) for v in state["queue"])


def with_variants(batches: list[PromptBatch], variants: Sequence[Variant]) -> list[PromptBatch]:
    """The micro-batches with their last ``len(variants)`` prompts replaced by the variants, in order."""
    flat = [(b, i) for b, batch in enumerate(batches) for i in range(len(batch.prompts))]
    replaced = dict(zip(flat[len(flat) - len(variants) :], variants, strict=True))
    out = []
    for b, batch in enumerate(batches):
        picked = [replaced.get((b, i)) for i in range(len(batch.prompts))]
        if all(v is None for v in picked):
            out.append(batch)
            continue
        rows = [batch.rows[i] if v is None else (v.row or {}) for i, v in enumerate(picked)] if batch.rows else []
        out.append(PromptBatch([batch.prompts[i] if v is None else v.prompt for i, v in enumerate(picked)],
                               [batch.references[i] if v is None else v.reference for i, v in enumerate(picked)],
                               [batch.sample_ids[i] if v is None else v.sample_id for i, v in enumerate(picked)],
                               rows))  # fmt: skip
    return out


def solved_flags(values: Sequence[float]) -> list[bool]:
    """Whether each completion solved its prompt: the first reward reached 1 (as rl/prompts_all_solved counts)."""
    return [value >= 1.0 for value in values]


def figures(total: dict[str, float]) -> dict[str, float]:
    """The step figures rl/curriculum/* from the sums over every worker."""
    return {f"rl/{name}": total[name] for name in FIGURES}


STATE_KEY = "curriculum"


def packed_state(inner: str | None, curriculum: Curriculum) -> str:
    """A rank's checkpointed state with a curriculum: the state without it (``inner``) and the queue."""
    return wrapped_state(STATE_KEY, curriculum.state(), inner)


def unpacked_state(text: str | None) -> tuple[str | None, dict[str, Any] | None]:
    """The inner state and the queue of :func:`packed_state` (a checkpoint written without a curriculum: its
    text is the inner state's own, and no queue)."""
    return unwrapped_state(STATE_KEY, text)


@dataclass(frozen=True)
class TokenizerCodec:
    """A Hugging Face tokenizer as a :class:`Codec`: a prompt's special tokens (a chat template's) decode to
    their text and encode back to themselves."""

    tokenizer: PreTrainedTokenizerBase

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens included."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, adding no special tokens (the prompt's own are in the text)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
