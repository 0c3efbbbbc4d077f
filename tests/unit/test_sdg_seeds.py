"""SDG seeds are read lazily: each seed once, committed seeds skipped by id, a bad row refused
only when it is reached."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.config.data import DatasetConfig
from rayft.config.sdg import SdgDecontaminationConfig
from rayft.errors import DataError
from rayft.sdg.rows import seed_id
from rayft.sdg.seeds import count_seeds, iter_seeds, read_eval_questions, seed_chunks


def _seeds(tmp_path: Path, n: int, tail: str = "") -> Path:
    path = tmp_path / "seeds.jsonl"
    rows = [{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"} for i in range(n)]
    rows.insert(2, rows[1])  # a repeated seed runs once
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def test_seeds_are_read_once_each_and_committed_ones_skipped(tmp_path: Path) -> None:
    cfg = load_config(None, [f"sdg.seeds.path={_seeds(tmp_path, 10)}", "sdg.seeds_per_batch=3"])
    seeds = list(iter_seeds(cfg.sdg))
    assert len(seeds) == 10
    done = {seed_id("What is 0 + 0?", "#### 0"), seed_id("What is 5 + 5?", "#### 10")}
    todo = list(iter_seeds(cfg.sdg, skip=done))
    assert [s["seed_question"] for s in todo] == [s["seed_question"] for s in seeds if s["seed_id"] not in done]
    assert count_seeds(cfg.sdg, done) == (10, 2)
    assert [len(c) for c in seed_chunks(todo, cfg.sdg)] == [8]  # 64 blocks of 3 seeds hold them all


def test_a_bad_row_is_refused_when_reached_not_before(tmp_path: Path) -> None:
    path = _seeds(tmp_path, 5, tail="{broken\n")
    cfg = load_config(None, [f"sdg.seeds.path={path}"])
    assert len(list(itertools.islice(iter_seeds(cfg.sdg), 3))) == 3  # read lazily: the end is not reached
    with pytest.raises(DataError, match=r"seeds.jsonl line 7: bad_json .*fix or remove the row"):
        list(iter_seeds(cfg.sdg))
    assert len(list(iter_seeds(cfg.sdg.model_copy(update={"num_seeds": 4})))) == 3  # 4 rows, one repeated


def test_decontamination_sets_are_read_by_the_row_reader_and_bad_ones_refused(tmp_path: Path) -> None:
    good = tmp_path / "eval.jsonl"
    good.write_text('{"question": "What is 2 + 2?"}\n{"question": ""}\n{"other": 1, "question": "Why?"}\n')
    both = [DatasetConfig(path=str(good)), DatasetConfig(path="builtin:arithmetic", split="test", max_rows=3)]
    questions = read_eval_questions(SdgDecontaminationConfig(datasets=both))
    assert questions[:2] == ["What is 2 + 2?", "Why?"] and len(questions) == 5  # an empty question is no problem
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "What is 2 + 2?"}\nnot json\n')
    with pytest.raises(DataError, match=r"decontamination set .*bad.jsonl line 2: bad_json .*fix or remove the row"):
        read_eval_questions(SdgDecontaminationConfig(datasets=[DatasetConfig(path=str(bad))]))
    with pytest.raises(DataError, match=r"has no column 'problem' \(columns: \['question', 'other'\]\)"):
        read_eval_questions(SdgDecontaminationConfig(datasets=both[:1], question_column="problem"))
