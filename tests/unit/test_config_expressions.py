"""Every expression a user writes in a config (a regular expression, a {placeholder} template, a Jinja
chat template) is compiled when the config is validated: one line naming its dotted path and what is
wrong, from `rayft config validate` and every command alike, never a traceback at the first row."""

from __future__ import annotations

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError

GRPO = ["train.objective=grpo", "data.packing=false"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [*GRPO, "train.rl.rewards=[{function: regex, pattern: '(unclosed'}]"],
            r"train\.rl\.rewards\.0\.pattern = '\(unclosed': not a regular expression \(missing \), unterminated "
            r"subpattern at position 0\); fix it",
        ),
        (
            ["data.datasets=[{path: d.jsonl, format: template, input_template: 'Q: {question', output_template: a}]"],
            r"data\.datasets\.0\.input_template = 'Q: {question': not a template \(.*\); write \{column\}",
        ),
        (
            ["data.datasets=[{path: d.jsonl, format: template, input_template: 'Q: {q.x}', output_template: a}]"],
            r"data\.datasets\.0\.input_template = 'Q: \{q\.x\}': .*placeholder \{q\.x\} is not a plain name",
        ),
        (
            ["model.chat_template={% for m in messages %}{{ m.content }}"],
            r"model\.chat_template = .*: not a Jinja template \(.*line 1.*\); fix it",
        ),
    ],
)
def test_a_bad_expression_is_refused_at_validation(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(None, overrides)
    assert len(str(caught.value).splitlines()) == 2  # the heading and the one problem


def test_an_expression_in_the_rl_stage_is_compiled_before_the_pipeline_starts() -> None:
    with pytest.raises(ConfigError, match=r"rl\.rewards\.0\.pattern = '\[a-': not a regular expression"):
        load_config(None, ["rl.rewards=[{function: regex, pattern: '[a-'}]"])


def test_good_expressions_pass() -> None:
    load_config(None, [
        *GRPO, "train.rl.rewards=[{function: regex, pattern: '^<answer>.*</answer>$'}]",
        "data.datasets=[{path: d.jsonl, format: template, input_template: 'Q: {question} {{x}}', output_template: a}]",
        "model.chat_template={% for m in messages %}{{ m.content }}{% endfor %}",
    ])  # fmt: skip
