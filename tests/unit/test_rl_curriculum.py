"""The curriculum's planner without Ray or torch: which prompts get which variant, that every variant is a
verified rewrite (harder: larger numbers, easier: smaller), the bounds (per step, the queue), that it is a
function of the step (a resumed queue serves what the uninterrupted one would), decontamination, and the
config's refusals."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.config.rl import CurriculumConfig
from rayft.data.builtin.arithmetic import iter_arithmetic_problems
from rayft.errors import ConfigError
from rayft.sdg.mathcheck import check_math_answer
from rayft.training.methods.rl import curriculum as cur
from rayft.training.methods.rl.sampling import PromptBatch

G = 4
NUMBER = re.compile(r"\d+")


class CharCodec:
    """Text as its code points: a tokenizer whose round trip is exact, so what the planner wrote is what it read."""

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


PROBLEMS = list(iter_arithmetic_problems(8))


def batch(indices: Sequence[int], *, rows: bool = False) -> PromptBatch:
    """Prompts of the built-in arithmetic problems ``indices`` (sample id = index), as a template prompt."""
    codec = CharCodec()
    prompts = [codec.encode(f"Question: {PROBLEMS[i]['question']}\nAnswer:") for i in indices]
    carried = [{"id": i} for i in indices] if rows else []
    return PromptBatch(prompts, [PROBLEMS[i]["answer"] for i in indices], list(indices), carried)


def curriculum(**settings: object) -> cur.Curriculum:
    return cur.Curriculum.build(CurriculumConfig.model_validate(settings), CharCodec(), seed=5, rank=0)


def final(reference: str) -> int:
    return int(reference.rsplit("####", 1)[1])


def numbers(text: str) -> list[int]:
    return [int(n) for n in NUMBER.findall(text)]


ALL, NONE, MIXED = [True] * G, [False] * G, [True, False, False, True]


def test_solved_prompts_get_harder_variants_and_unsolved_ones_easier() -> None:
    c = curriculum(max_per_step=8)
    c.observe([(batch([0, 1, 2], rows=True), ALL + MIXED + NONE)], step=3)
    queued = list(c.queue)
    assert [v.kind for v in queued] == ["harder", "easier"]  # the mixed prompt teaches already: no variant
    assert [v.row for v in queued] == [{"id": 0}, {"id": 2}]  # the parent's carried columns go with it
    assert [v.sample_id for v in queued] == [cur.VARIANT_IDS, cur.VARIANT_IDS + 1]
    for variant, parent in zip(queued, (0, 2), strict=True):
        assert check_math_answer(variant.reference) is None  # a verified, re-computed solution
        question = CharCodec().decode(variant.prompt)
        assert question.startswith("Question: ") and question.endswith("\nAnswer:")
        assert question != f"Question: {PROBLEMS[parent]['question']}\nAnswer:"
    # harder_scale 10: every number of the question drawn near ten times the seed's (at least 5 times).
    harder_numbers = numbers(CharCodec().decode(queued[0].prompt))
    assert min(harder_numbers) >= 5 * min(numbers(PROBLEMS[0]["question"]))
    assert final(queued[0].reference) > final(PROBLEMS[0]["answer"])
    easier_numbers = numbers(CharCodec().decode(queued[1].prompt))
    assert max(easier_numbers) < max(numbers(PROBLEMS[2]["question"]))
    sums: dict[str, float] = {}
    c.take_sums(sums)
    assert sums["curriculum/harder_added"] == 1 and sums["curriculum/easier_added"] == 1
    assert sums["curriculum/queue"] == 2


def test_kinds_can_be_switched_off_and_a_group_asks_for_one_variant_at_most() -> None:
    both = CurriculumConfig()
    assert [cur.wanted(s, both) for s in (ALL, NONE, MIXED)] == ["harder", "easier", None]
    only_easier = CurriculumConfig(harder=False)
    assert [cur.wanted(s, only_easier) for s in (ALL, NONE, MIXED)] == [None, "easier", None]


def test_rows_the_generator_cannot_vary_are_counted_not_varied() -> None:
    c = curriculum()
    prompts = PromptBatch([CharCodec().encode("Write a haiku about 3 cats")], ["Soft paws on 3 mats"], [7])
    c.observe([(prompts, ALL)], step=1)
    assert not c.queue and c.record.not_rewritable == 1 and c.record.harder_added == 0


def test_at_most_max_per_step_variants_a_step() -> None:
    c = curriculum(max_per_step=2)
    c.observe([(batch([0, 1]), ALL + NONE), (batch([2, 3]), NONE + ALL)], step=1)
    assert [v.kind for v in c.queue] == ["harder", "easier"]  # the first two, in the prompts' order


def test_the_queue_is_bounded_dropping_its_oldest() -> None:
    c = curriculum(max_per_step=8, queue_size=3)
    c.observe([(batch([0, 1, 2, 3, 4]), ALL * 5)], step=1)
    assert len(c.queue) == 3 and c.record.dropped == 2
    assert [v.sample_id - cur.VARIANT_IDS for v in c.queue] == [2, 3, 4]  # the newest three


def test_serving_replaces_the_steps_last_prompts_oldest_variant_first() -> None:
    c = curriculum(max_per_step=8, serve_per_step=3)
    c.observe([(batch([0, 1, 2, 3], rows=True), ALL * 4)], step=1)
    queued = list(c.queue)
    served = c.serve([batch([4, 5], rows=True), batch([6, 7], rows=True)])
    assert [b.sample_ids for b in served] == [[4, queued[0].sample_id], [queued[1].sample_id, queued[2].sample_id]]
    assert served[0].prompts[1] == queued[0].prompt
    assert served[1].references == [queued[1].reference, queued[2].reference]
    assert served[0].rows == [{"id": 4}, {"id": 0}]  # each prompt keeps its own row
    assert list(c.queue) == queued[3:] and c.record.served == 3
    # Never more than the step holds; nothing queued: the step's prompts untouched.
    c.queue.extend(queued * 2)
    assert [b.sample_ids for b in c.serve([batch([4])])] == [[queued[3].sample_id]]
    empty = curriculum()
    step = [batch([4, 5])]
    assert empty.serve(step) is step


def test_variants_are_a_function_of_the_step_and_a_restored_queue_serves_the_same() -> None:
    def run(steps: range, c: cur.Curriculum) -> list[list[int]]:
        served = []
        for step in steps:
            for b in c.serve([batch([step % 8, (step + 3) % 8])]):
                served.append(b.sample_ids)
            c.observe([(batch([step % 8, (step + 1) % 8]), ALL + NONE)], step=step)
        return served

    whole = curriculum(serve_per_step=1)
    first = curriculum(serve_per_step=1)
    served = run(range(1, 4), first)
    # A checkpoint after step 3: through JSON, as the rank's state is written.
    resumed = curriculum(serve_per_step=1)
    inner, state = cur.unpacked_state(cur.packed_state('{"rollouts": null}', first))
    assert inner == '{"rollouts": null}' and state is not None
    resumed.restore(json.loads(json.dumps(state)))
    served += run(range(4, 7), resumed)
    assert served == run(range(1, 7), whole)
    assert list(resumed.queue) == list(whole.queue) and resumed.made == whole.made
    # Another rank, or another seed, draws other numbers.
    other = cur.Curriculum(CurriculumConfig(), CharCodec(), seed=5, rank=1)
    other.observe([(batch([0]), ALL)], step=1)
    again = curriculum()
    again.observe([(batch([0]), ALL)], step=1)
    assert other.queue[0].prompt != again.queue[0].prompt


def test_a_state_without_a_curriculum_is_the_inner_state() -> None:
    assert cur.unpacked_state(None) == (None, None)
    assert cur.unpacked_state("not json") == ("not json", None)
    assert cur.unpacked_state('{"dynamic_sampling": {}}') == ('{"dynamic_sampling": {}}', None)


def test_variants_that_leak_into_an_evaluation_set_are_discarded(tmp_path: Path) -> None:
    # The evaluation set holds problem 0 itself: with numbers masked, any variant of it shares its n-grams.
    held_out = tmp_path / "test.jsonl"
    held_out.write_text(json.dumps({"question": PROBLEMS[0]["question"]}) + "\n")
    c = curriculum(decontamination={"datasets": [{"path": str(held_out)}]})
    c.observe([(batch([0, 1]), ALL + ALL)], step=1)
    assert c.record.leaked >= 1
    leaked_story = " ".join(PROBLEMS[0]["question"].split()[1:6])  # words after the name, numbers aside
    assert all(leaked_story not in CharCodec().decode(v.prompt) for v in c.queue)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.rl.curriculum={harder: false, easier: false}"], r"harder and easier are both false"),
        (["train.rl.curriculum={}", "train.rl.rollout.placement=actors"], r"curriculum .*needs rollout\.placement"),
        (["train.rl.curriculum={harder_scale: 1}"], r"harder_scale"),
        (["train.rl.curriculum={queue: 3}"], r"queue"),
    ],
)
def test_curriculum_settings_that_cannot_work_are_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_config(None, ["train.objective=grpo", "data.packing=false", *overrides])
    # The loader's header, then the problem on one line naming the field.
    assert len(str(info.value).splitlines()) == 2 and "train.rl" in str(info.value)


def test_the_curriculum_figures_are_its_sums() -> None:
    total = {name: float(i) for i, name in enumerate(cur.FIGURES)}
    figures = cur.figures(total)
    assert set(figures) == {f"rl/curriculum/{n}" for n in (*cur.COUNTS, "queue")}
    assert figures["rl/curriculum/queue"] == total["curriculum/queue"]
