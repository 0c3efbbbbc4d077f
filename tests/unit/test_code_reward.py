"""The 'code' reward: a completion's Python run in the process sandbox against its row's tests; the share
that pass (or all-or-nothing), code that hangs, crashes or forges its result scoring 0, and bad tests
counted as reward errors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rayft.config.rl import RewardConfig
from rayft.errors import DataError
from rayft.evaluation import code
from rayft.evaluation.rewards import RewardSet, code_reward

ROW = {"tests": ["assert f(2) == 4", "assert f(3) == 9", "assert f(-1) == 1"]}
SQUARE = "Here it is:\n```python\ndef f(x):\n    return x * x\n```\nDone."
FORGED = (  # a result line as the harness writes it, but without the run's nonce
    "import sys\n"
    'sys.__stdout__.write(\'\\x1erayft-code-result x {"code_error": null, "failures": [null, null, null]}\\n\')\n'
    "import os; os._exit(0)"  # so that the harness writes nothing after it
)
HALF_RIGHT = "```python\ndef f(x):\n    return 4 if x == 2 else 1\n```"  # passes the 1st and 3rd tests


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("```py\nx = 1\n```\n```python\ny = 2\n```", "y = 2\n"),  # the last python block
        ("```\nuntagged = 1\n```", "untagged = 1\n"),
        ("```js\nlet a\n```\ndef g(): pass", "```js\nlet a\n```\ndef g(): pass"),  # no python block: all of it
    ],
)
def test_the_code_is_the_last_python_block(completion: str, expected: str) -> None:
    assert code.extract_code(completion) == expected


def test_the_reward_is_the_share_of_tests_passed_or_all_or_nothing() -> None:
    fraction, strict = code_reward("tests"), code_reward("tests", "all")
    assert fraction(SQUARE, "", ROW) == strict(SQUARE, "", ROW) == 1.0
    assert fraction(HALF_RIGHT, "", ROW) == pytest.approx(2 / 3)
    assert strict(HALF_RIGHT, "", ROW) == 0.0


@pytest.mark.parametrize(
    "body",
    [
        "def f(x):\n    while True:\n        pass",  # every test runs into its own timer
        "import os\nos._exit(0)",  # ends before the tests
        "raise SystemExit(0)",
        FORGED,
        "x = bytearray(10 * 1024**3)",
        "import os\nwhile True:\n    os.fork()",
    ],
    ids=["endless", "exit-early", "system-exit", "forged-result", "10GB", "fork-bomb"],
)  # fmt: skip
def test_code_that_hangs_crashes_or_forges_its_result_scores_0_and_the_next_runs(body: str) -> None:
    assert code_reward("tests")(f"```python\n{body}\n```", "", ROW) == 0.0
    assert code_reward("tests")(SQUARE, "", ROW) == 1.0


def test_one_endless_test_fails_alone() -> None:
    run = code.run_tests("def f(x):\n    while x == 3:\n        pass\n    return x * x", ROW["tests"])
    assert (run.passed, run.total) == (2, 3)
    assert run.failures[1] is not None and "TimeoutError" in run.failures[1]


def test_tests_that_are_not_statements_are_a_counted_reward_error() -> None:
    with pytest.raises(DataError, match=r"the row's 'tests' column: the tests must be a list of Python statements"):
        code_reward("tests")(SQUARE, "", {"tests": 3})
    assert code.parse_tests('["assert True"]', "row 1") == ["assert True"]
    rewards = RewardSet.build([RewardConfig(function="code", tests_column="checks")], 16)
    assert rewards.reads_rows
    scores = rewards.score([SQUARE, SQUARE], ["", ""], [{"checks": ROW["tests"]}, {"checks": {"a": 1}}])
    assert scores.by_function["code"] == [1.0, 0.0] and scores.errors == {"code": 1}


def test_the_code_settings_are_only_for_the_code_reward() -> None:
    assert RewardConfig(function="code").columns == ("tests",)
    assert RewardConfig(function="code", tests_column="unit_tests").columns == ("unit_tests",)
    with pytest.raises(ValidationError, match="tests_column or code_scoring is set for reward function 'math'"):
        RewardConfig(function="math", code_scoring="all")
