"""`rayft generate` without a model: reading prompts and rejecting bad lines, the output rows, the
atomic writer, and the generation section built for a source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.data.formats import REASONS
from rayft.errors import DataError
from rayft.files import write_jsonl_atomic
from rayft.generation.backend import Generation, ToolChat
from rayft.inference.batch import default_rejects_path, generation_config, output_row, plan_paths
from rayft.inference.prompts import read_prompts
from rayft.recipes.generate import run
from tests.support.generation import json_lines

LINES = [
    '{"id": 1, "prompt": "What is 2 + 2?"}',
    "",
    '{"id": 2, "messages": [{"role": "user", "content": "hi"}], "meta": {"k": [1, 2]}}',
    '{"id": 3, "prompt": "x", "messages": [{"role": "user", "content": "ignored"}]}',
    '{"id": 4, "conversations": [{"from": "human", "value": "shared gpt"}]}',
    "not json at all",
    "[1, 2]",
    '{"id": 6, "prompt": "   "}',
    '{"id": 7, "prompt": 42}',
    '{"id": 8, "messages": [{"role": "wizard", "content": "abracadabra"}]}',
    '{"id": 9, "messages": ["just a string"]}',
    '{"id": 10, "prompt": null}',
]


def _parse(lines: list[str], field: str | None = None) -> tuple[list[tuple[int, object]], list[tuple[int, str]]]:
    parsed = read_prompts(json_lines([line.encode() + b"\n" for line in lines]), field)
    return [(r.line, r.prompt) for r in parsed.rows], [(r.line, r.reason) for r in parsed.rejected]


def test_every_line_is_a_prompt_or_a_rejected_row_with_its_line_number() -> None:
    rows, rejected = _parse(LINES)
    assert rows == [
        (1, "What is 2 + 2?"),
        (3, [{"role": "user", "content": "hi"}]),
        (4, "x"),  # 'prompt' wins over 'messages'
    ]
    assert rejected == [
        (5, "missing_field"),  # ShareGPT turns under another column need --field conversations
        (6, "bad_json"),
        (7, "bad_json"),
        (8, "empty_field"),
        (9, "wrong_type"),
        (10, "unknown_role"),
        (11, "wrong_type"),
        (12, "missing_field"),
    ]
    assert {reason for _, reason in rejected} <= set(REASONS)


def test_generate_reads_with_the_data_reader_and_its_reject_codes() -> None:
    """One reader of JSON Lines: generate's prompts come from the data reader's rows, and every reason a line is
    rejected for is one of the data plane's codes (no reason of generate's own)."""
    from rayft.inference import prompts

    assert not hasattr(prompts, "REASONS")
    _, rejected = _parse(LINES)
    assert {reason for _, reason in rejected} <= set(REASONS)


def test_field_names_the_prompt_column_and_sharegpt_turns_are_read() -> None:
    rows, rejected = _parse(LINES[:5], "conversations")
    assert rows == [(5, [{"role": "user", "content": "shared gpt"}])]
    assert [line for line, _ in rejected] == [1, 3, 4]


def test_rejected_rows_say_what_is_wrong_and_keep_the_text() -> None:
    parsed = read_prompts(
        json_lines([b'{"id": 1, "text": "hello"}\n', b"\xff\xfe{}\n", b'{"prompt": ' + b"9" * 3000 + b"}\n"])
    )
    missing, not_utf8, wrong = (r.to_dict() for r in parsed.rejected)
    assert missing == {
        "line": 1,
        "reason": "missing_field",
        "detail": "no 'prompt' or 'messages' field (fields: 'id', 'text'); choose the column with --field",
        "value": '{"id": 1, "text": "hello"}',
    }
    assert (not_utf8["reason"], not_utf8["line"], not_utf8["value"]) == ("bad_encoding", 2, "\ufffd\ufffd{}")
    assert not_utf8["detail"] == "not UTF-8: byte 0xff at offset 0 of the line (invalid start byte)"
    assert wrong["detail"] == "'prompt' is a int; give a string or a list of chat turns"
    assert len(wrong["value"]) == 2003 and wrong["value"].endswith("...")
    assert parsed.rejected_by_reason() == {"missing_field": 1, "bad_encoding": 1, "wrong_type": 1}


def test_a_conversation_column_holding_a_string_and_a_repeated_key_are_rejected_per_line() -> None:
    lines = [b'{"messages": "a string"}\n', b'{"prompt": "a", "prompt": "b"}\n', b'{"prompt": "fine"}\n',
             b'{"prompt": "x", "meta": {"k": 1, "k": 2}}\n']  # fmt: skip
    parsed = read_prompts(json_lines(lines))
    assert [row.line for row in parsed.rows] == [3]
    rejected = [(r.line, r.reason, r.detail) for r in parsed.rejected]
    assert rejected == [
        (1, "wrong_type", "'messages' is a string; give a list of chat turns ({role, content}) or the text as "
                          "'prompt'"),
        (2, "duplicate_key", "key 'prompt' appears twice in one object; keep one"),
        (4, "duplicate_key", "key 'k' appears twice in one object; keep one"),
    ]  # fmt: skip


def test_output_rows_carry_the_other_columns_in_input_order() -> None:
    parsed = read_prompts(json_lines([line.encode() + b"\n" for line in LINES[:4]]))
    generations = [Generation("4", 5, 1, "stop"), Generation("", finish_reason="error", error="boom"),
                   Generation("y", 2, 3, "length")]  # fmt: skip
    out = [output_row(row, generation) for row, generation in zip(parsed.rows, generations, strict=True)]
    assert [row["id"] for row in out] == [1, 2, 3]
    assert out[1]["meta"] == {"k": [1, 2]} and out[1]["messages"] == [{"role": "user", "content": "hi"}]
    assert out[0] | {} == {"id": 1, "prompt": "What is 2 + 2?", "generation": "4", "finish_reason": "stop",
                           "error": None, "num_prompt_tokens": 5, "num_generated_tokens": 1}  # fmt: skip
    assert (out[1]["error"], out[2]["finish_reason"]) == ("boom", "length")


def test_the_writer_never_leaves_half_a_file(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_jsonl_atomic(path, [{"a": 1}])

    def rows_then_crash():  # type: ignore[no-untyped-def]
        yield {"a": 2}
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError, match="crash mid-write"):
        write_jsonl_atomic(path, rows_then_crash())
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"a": 1}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no temporary file left


def test_default_rejects_path() -> None:
    assert default_rejects_path(Path("d/out.jsonl")) == Path("d/out.rejects.jsonl")
    assert default_rejects_path(Path("d/results")) == Path("d/results.rejects.jsonl")


def test_plan_paths_puts_rejects_beside_the_output_and_refuses_overwriting_the_input(tmp_path: Path) -> None:
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    paths = plan_paths(prompts, tmp_path / "out.jsonl")
    assert (paths.input, paths.output, paths.rejects) == (
        prompts,
        tmp_path / "out.jsonl",
        tmp_path / "out.rejects.jsonl",
    )
    assert plan_paths(prompts, tmp_path / "out.jsonl", tmp_path / "r.jsonl").rejects == tmp_path / "r.jsonl"
    with pytest.raises(DataError, match="--rejects .* is the input file"):
        plan_paths(prompts, tmp_path / "out.jsonl", prompts)
    with pytest.raises(DataError, match="--input .* is not a file"):
        plan_paths(tmp_path / "missing.jsonl", tmp_path / "out.jsonl")


def test_generation_config_takes_the_inference_section(tmp_path: Path) -> None:
    tiny_model_dir = tmp_path / "model"
    tiny_model_dir.mkdir()
    (tiny_model_dir / "config.json").write_text("{}")  # a model directory, as far as resolving goes
    (tiny_model_dir / "tokenizer_config.json").write_text("{}")
    cfg = load_config(None, ["inference.temperature=0", "inference.num_workers=2", "inference.batch_size=4"])
    gen, described = generation_config(cfg, str(tiny_model_dir))
    assert (gen.model.name, gen.adapter_path, gen.temperature, gen.concurrency, gen.batch_size) == (
        str(tiny_model_dir.resolve()), None, 0.0, 2, 4)  # fmt: skip
    assert described == str(tiny_model_dir.resolve())
    remote = load_config(None, ["inference.backend=openai", "inference.endpoint.base_url=http://h:9/v1"])
    gen, described = generation_config(remote, "served-model")
    assert (gen.backend, gen.model.name, described) == ("openai", "served-model", "served-model at http://h:9/v1")


def test_inputs_are_checked_before_anything_loads(tmp_path: Path) -> None:
    cfg = load_config(None, [])
    with pytest.raises(DataError, match="--input '.*missing.jsonl' is not a file"):
        run(cfg, "smollm2-135m-instruct", tmp_path / "missing.jsonl", tmp_path / "out.jsonl")
    source = tmp_path / "in.jsonl"
    source.write_text("oops\n[]\n")
    with pytest.raises(DataError, match="--output .* is the input file"):
        run(cfg, "smollm2-135m-instruct", source, source)
    with pytest.raises(DataError, match=r"no line has a usable prompt \(2 rejected, listed in .*in.rejects.jsonl\)"):
        run(cfg, "smollm2-135m-instruct", source, tmp_path / "in.out.jsonl", rejects_path=tmp_path / "in.rejects.jsonl")
    assert [json.loads(x)["reason"] for x in (tmp_path / "in.rejects.jsonl").read_text().splitlines()] == [
        "bad_json", "bad_json"]  # fmt: skip


def test_a_jobs_address_is_refused_with_the_fix(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli

    args = ["generate", "m", "--input", "a.jsonl", "--output", "b.jsonl", "--address", "http://head:8265"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert "joins the cluster rather than running as a Ray Job; give the head's GCS address" in result.output


def test_a_server_that_refuses_the_key_is_said_before_any_prompt_is_sent(tmp_path: Path) -> None:
    """With the openai backend the server is asked first (GET /models), as `rayft eval` does: a refused key is one
    error and a non-zero exit, not a file of rows that all failed."""
    from click.testing import CliRunner

    from rayft.cli.main import cli
    from tests.support.openai_server import OpenAIServer

    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    with OpenAIServer(responder=lambda request: "x", api_key="sk-right") as server:
        args = ["generate", "rayft-test", f"inference.endpoint.base_url={server.base_url}", "--backend", "openai",
                "--input", str(source), "--output", str(tmp_path / "out.jsonl")]  # fmt: skip
        result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "needs an API key (HTTP 401) and none was sent" in result.output and server.requests == []


def test_every_generation_failing_is_an_error_with_the_rows_kept(tmp_path: Path) -> None:
    """A run whose every row failed is no success: it raises (the CLI exits non-zero) naming the first error,
    and the output keeps each row with its error."""
    from rayft.errors import EndpointError
    from tests.support.openai_server import OpenAIServer

    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    with OpenAIServer(responder=lambda request: "x") as server:
        server.fail_next(401, times=2)  # the listing passes, every prompt is refused
        cfg = load_config(None, ["inference.backend=openai", f"inference.endpoint.base_url={server.base_url}"])
        with pytest.raises(EndpointError, match=r"all 2 generations failed \(first: RuntimeError: HTTP 401 from"):
            run(cfg, "rayft-test", source, tmp_path / "out.jsonl", runtime="local")
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [row["finish_reason"] for row in rows] == ["error", "error"]


ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}


def test_tool_rows_become_tool_chats_checked_as_training_checks_them() -> None:
    asked = {"role": "user", "content": "1 + 2?"}
    lines = [
        json.dumps({"messages": [asked], "tools": [ADD]}),
        json.dumps({"messages": [asked, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                 {"role": "tool", "tool_call_id": "c1", "content": "3"}], "tools": [ADD]}),
        json.dumps({"messages": [asked, {"role": "assistant", "tool_calls": [{**CALL, "function": {
            "name": "mul", "arguments": "{}"}}]}], "tools": [ADD]}),
        json.dumps({"messages": [asked, {"role": "tool", "content": "3"}], "tools": [ADD]}),
        json.dumps({"messages": [asked], "tools": "not json"}),
        json.dumps({"messages": [asked, {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}],
                    "tools": [ADD]}),
    ]  # fmt: skip
    parsed = read_prompts(json_lines([line.encode() + b"\n" for line in lines]))
    first, second = (row.prompt for row in parsed.rows)
    assert isinstance(first, ToolChat) and first.tools == (ADD,) and list(first) == [asked]
    assert isinstance(second, ToolChat) and [m["role"] for m in second] == ["user", "assistant", "tool"]
    assert second[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1, "b": 2}
    assert second[2] == {"role": "tool", "content": "3", "tool_call_id": "c1", "name": "add"}
    reasons = [(r.line, r.reason) for r in parsed.rejected]
    assert reasons == [(3, "unknown_tool"), (4, "orphan_tool_result"), (5, "bad_tools"), (6, "bad_tool_call")]
    assert all(reason in REASONS for _, reason in reasons)
    assert _parse(['{"messages": [{"role": "user", "content": "no tools"}]}'])[0] == [
        (1, [{"role": "user", "content": "no tools"}])]  # fmt: skip


def test_a_tool_rows_output_carries_the_calls_read_from_the_generation() -> None:
    (row,) = read_prompts(json_lines([json.dumps({"messages": [{"role": "user", "content": "x"}],
                                                  "tools": [ADD]}).encode() + b"\n"])).rows  # fmt: skip
    text = 'Sure.\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n<tool_call>{oops</tool_call>'
    out = output_row(row, Generation(text))
    assert out["generation"] == text
    function = {"name": "add", "arguments": '{"a": 1}'}
    assert out["tool_calls"] == [{"id": "call_0", "type": "function", "function": function}]
    assert len(out["tool_call_errors"]) == 1 and "tool call 2 of the output is not JSON" in out["tool_call_errors"][0]
    (plain,) = read_prompts(json_lines([b'{"prompt": "x"}\n'])).rows
    assert "tool_calls" not in output_row(plain, Generation(text))
