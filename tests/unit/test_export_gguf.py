"""GGUF export of the tiny Llama, read back with gguf's own reader: names and layout llama.cpp
expects, f16 tensors bit-equal to the Hugging Face weights, quantized tensors within their block
rounding bound, tokenizer and chat template inside; the Ollama Modelfile beside it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rayft.errors import ConfigError
from rayft.export.gguf_file import pre_tokenizer_name, write_gguf, write_gguf_exports
from rayft.export.modelfile import CHATML_GO_TEMPLATE, render_modelfile
from tests.support.gguf_models import build_tiny_qwen2, qwen2_pre_tokenizer, tiny_family


def _hf_weights(model_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return {k: v.astype(np.float32) for k, v in load_file(str(model_dir / "model.safetensors")).items()}


def _reader(path: Path) -> Any:
    import gguf

    return gguf.GGUFReader(str(path))


def _field(reader: Any, key: str) -> Any:
    return reader.fields[key].contents()


def _tensors(reader: Any) -> dict[str, Any]:
    return {t.name: t for t in reader.tensors}


def _rope_pairs(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face rotates row i with row i + d/2 of each head; llama.cpp rotates rows 2i and 2i+1.
    Written with explicit indices, apart from the writer's reshape, to check it."""
    d = weights.shape[0] // n_head
    order = [h * d + i + half * (d // 2) for h in range(n_head) for i in range(d // 2) for half in (0, 1)]
    return weights[order]


@pytest.fixture(scope="module")
def f16_file(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "tiny-f16.gguf"
    write_gguf(tiny_model_dir, out, "f16")
    return out


def test_f16_tensors_are_the_hf_weights_bit_for_bit_in_llama_cpp_names(tiny_model_dir: Path, f16_file: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    hf = _hf_weights(tiny_model_dir)
    tensors = _tensors(_reader(f16_file))
    expected: dict[str, np.ndarray] = {"token_embd.weight": hf["model.embed_tokens.weight"]}
    expected["output_norm.weight"] = hf["model.norm.weight"]
    layer_names = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for i in range(config["num_hidden_layers"]):
        for ours, theirs in layer_names.items():
            expected[f"blk.{i}.{ours}.weight"] = hf[f"model.layers.{i}.{theirs}.weight"]
        q, k = hf[f"model.layers.{i}.self_attn.q_proj.weight"], hf[f"model.layers.{i}.self_attn.k_proj.weight"]
        expected[f"blk.{i}.attn_q.weight"] = _rope_pairs(q, config["num_attention_heads"])
        expected[f"blk.{i}.attn_k.weight"] = _rope_pairs(k, config["num_key_value_heads"])
    assert set(tensors) == set(expected)  # tied embeddings: no output.weight, llama.cpp reuses token_embd
    for name, want in expected.items():
        got = tensors[name]
        if want.ndim == 1:
            assert got.tensor_type.name == "F32"
            assert np.array_equal(np.asarray(got.data), want), name
        else:
            assert got.tensor_type.name == "F16"
            # f16 of the float32 weights, bit for bit; GGUF lists dims innermost first
            assert list(got.shape) == list(reversed(want.shape)), name
            assert np.array_equal(np.asarray(got.data).view(np.uint16), want.astype(np.float16).view(np.uint16)), name


def test_metadata_carries_the_model_shape_tokenizer_and_chat_template(tiny_model_dir: Path, f16_file: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    reader = _reader(f16_file)
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "llama.block_count") == config["num_hidden_layers"]
    assert _field(reader, "llama.attention.head_count_kv") == config["num_key_value_heads"]
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.pre") == "gpt-2"
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert tokens == [tokenizer.convert_ids_to_tokens(i) for i in range(config["vocab_size"])]
    merges = json.loads((tiny_model_dir / "tokenizer.json").read_text())["model"]["merges"]
    assert len(_field(reader, "tokenizer.ggml.merges")) == len(merges) > 0
    assert _field(reader, "tokenizer.ggml.eos_token_id") == tokenizer.eos_token_id
    assert _field(reader, "tokenizer.chat_template") == tokenizer.chat_template
    assert _field(reader, "tokenizer.ggml.add_bos_token") is False  # the tiny tokenizer has no BOS, as SmolLM2's
    assert _field(reader, "tokenizer.ggml.add_eos_token") is False
    types = _field(reader, "tokenizer.ggml.token_type")
    assert types[tokenizer.convert_tokens_to_ids("<|im_end|>")] == 3  # CONTROL: a special token, never split


@pytest.mark.parametrize(("gguf_type", "bound"), [("q8_0", 0.6 / 127), ("q4_0", 1.01 / 8)])
def test_quantized_tensors_dequantize_within_their_block_rounding(
    tiny_model_dir: Path, tmp_path: Path, gguf_type: str, bound: float
) -> None:
    from gguf import quants

    write_gguf(tiny_model_dir, tmp_path / "m.gguf", gguf_type)
    tensors = _tensors(_reader(tmp_path / "m.gguf"))
    hf = _hf_weights(tiny_model_dir)
    want = hf["model.layers.0.mlp.down_proj.weight"]
    got = tensors["blk.0.ffn_down.weight"]
    assert got.tensor_type.name == gguf_type.upper()
    back = quants.dequantize(np.asarray(got.data), got.tensor_type).reshape(want.shape)
    # Per block of 32 the scale is amax/127 (Q8_0) or amax/8 (Q4_0): rounding to the grid errs by at most
    # half a step for Q8_0 (+ the f16 rounding of the scale times 127, < 0.1 step), and by up to one step for
    # Q4_0, whose grid [-8, 7] clips the side opposite the largest value.
    amax = np.abs(want.reshape(-1, 32)).max(axis=1, keepdims=True)
    assert (np.abs(back - want).reshape(-1, 32) <= bound * amax + 1e-12).all()
    embd = "Q8_0" if gguf_type == "q4_0" else gguf_type.upper()  # the embedding stays 8-bit in a 4-bit file
    assert tensors["token_embd.weight"].tensor_type.name == embd


def test_exports_and_modelfile_are_written_beside_the_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "exported"
    shutil.copytree(tiny_model_dir, model_dir)
    written = write_gguf_exports(model_dir, "my-model", ["q8_0", "f16"])
    assert [w["file"] for w in written] == ["my-model-q8_0.gguf", "my-model-f16.gguf"]
    assert written[0]["bytes"] < written[1]["bytes"]
    text = (model_dir / "Modelfile").read_text()
    assert text.startswith("FROM ./my-model-q8_0.gguf\n")
    assert f'TEMPLATE """{CHATML_GO_TEMPLATE}"""' in text
    assert 'PARAMETER stop "<|im_end|>"' in text and "PARAMETER num_ctx 2048" in text


def test_a_template_ollama_cannot_be_given_is_left_to_the_gguf() -> None:
    text = render_modelfile("m.gguf", chat_template="{{ messages }}", stops=["</s>"], context_length=8)
    assert "TEMPLATE" not in text.replace("# No TEMPLATE", "") and 'PARAMETER stop "</s>"' in text


def test_an_architecture_it_cannot_convert_is_refused_by_name(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "mistral"
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | {"architectures": ["MistralForCausalLM"]}))
    with pytest.raises(ConfigError, match=r"MistralForCausalLM.*convert_hf_to_gguf"):
        write_gguf(model_dir, tmp_path / "x.gguf", "f16")
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_transformers_gguf_reader_gets_the_hf_model_back(tiny_model_dir: Path, tmp_path: Path, family: str) -> None:
    """transformers' GGUF loader is an independent reader (its own name map, inverse rotary permutation
    and tokenizer conversion): from the f16 file it rebuilds the model with the same tokens and logits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # qwen2 with Qwen2's own pre-tokenizer: transformers reads a qwen2 file's vocabulary as Qwen2's
    model_dir = tiny_family(family, tiny_model_dir, tmp_path / "m")
    write_gguf(model_dir, model_dir / "m-f16.gguf", "f16")
    from_gguf = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file="m-f16.gguf", dtype=torch.float32).eval()
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # as the file holds them: matrices in float16, norms and biases in float32
        for parameter in hf.parameters():
            if parameter.ndim > 1:
                parameter.copy_(parameter.half().float())
    tokenizer, gguf_tokenizer = (
        AutoTokenizer.from_pretrained(model_dir),
        AutoTokenizer.from_pretrained(model_dir, gguf_file="m-f16.gguf"),
    )
    for prompt in ["What is 3 + 4?", "SELECT name FROM table WHERE age = 30", "The quick brown fox"]:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        assert gguf_tokenizer(prompt, return_tensors="pt").input_ids.tolist() == ids.tolist()
        with torch.inference_mode():
            # The same f16-rounded weights through the same float32 forward: only float32 rounding of
            # differently laid-out matmuls differs, eps 1.2e-7 x hidden 32 x |logit| < 1 < 4e-6.
            assert float((from_gguf(ids).logits - hf(ids).logits).abs().max()) <= 1e-5
            greedy = from_gguf.generate(ids, max_new_tokens=12, do_sample=False)
            assert greedy.tolist() == hf.generate(ids, max_new_tokens=12, do_sample=False).tolist()


def test_cli_refuses_gguf_of_an_unmerged_adapter_before_anything_loads(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4, "base_model_name_or_path": "org/base"}))
    result = CliRunner().invoke(cli, ["export", str(adapter), str(tmp_path / "out"), "--no-merge", "--format", "gguf"])
    assert result.exit_code != 0
    assert "export.format gguf needs merged weights" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_cli_passes_the_gguf_types_to_the_config() -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli

    result = CliRunner().invoke(cli, ["export", "/nonexistent", "/tmp/x", "--format", "gguf", "--gguf-types", "q5_k"])
    assert result.exit_code != 0 and "gguf_types" in result.output and "q5_k" in result.output


SMOLLM2_TEMPLATE = (  # SmolLM2-Instruct's chat template: a default system turn when the conversation has none
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "What is 3 + 4?"}],
    [{"role": "system", "content": "Answer {{ briefly }}."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another,\nplease."},
    ],
]


def go_template_render(template: str, messages: list[dict[str, str]], tmp_path: Path) -> str:
    """``template`` executed by Go's text/template (Helm's engine, through its Go SDK) with Ollama's
    ``.Messages`` (each with ``.Role`` and ``.Content``): the template language Ollama runs."""
    import helm_python as helm

    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True, exist_ok=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: chart\nversion: 0.1.0\n")
    (chart / "templates" / "prompt.txt").write_text("{{- with .Values }}" + template + "{{ end }}")
    values = {"Messages": [{"Role": m["role"], "Content": m["content"]} for m in messages]}
    with helm.Chart.load(chart) as loaded:
        return loaded.render(values, name="r", namespace="n")["chart/templates/prompt.txt"]


def _modelfile_template(text: str) -> str:
    return text.split('TEMPLATE """', 1)[1].split('"""', 1)[0]


@pytest.mark.parametrize("chat_template", ["chatml", "smollm2"])
def test_modelfile_template_renders_the_chat_as_the_tokenizer_does(
    tiny_model_dir: Path, tmp_path: Path, chat_template: str
) -> None:
    from transformers import AutoTokenizer

    model_dir = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model_dir)
    if chat_template == "smollm2":
        (model_dir / "chat_template.jinja").write_text(SMOLLM2_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    write_gguf_exports(model_dir, "m", ["q8_0"])
    template = _modelfile_template((model_dir / "Modelfile").read_text())
    first = tokenizer.apply_chat_template(CONVERSATIONS[0], tokenize=False, add_generation_prompt=True)
    assert first.startswith("<|im_start|>system\n") == (chat_template == "smollm2")  # the case this covers
    for messages in CONVERSATIONS:
        want = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert go_template_render(template, messages, tmp_path) == want


def test_qwen2_is_written_under_its_own_names_with_biases_and_unpermuted_rows(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model_dir = build_tiny_qwen2(tiny_model_dir, tmp_path / "qwen2")
    written = write_gguf(model_dir, tmp_path / "q.gguf", "f16")
    assert written["arch"] == "qwen2"
    reader = _reader(tmp_path / "q.gguf")
    assert _field(reader, "general.architecture") == "qwen2"
    assert _field(reader, "qwen2.attention.head_count_kv") == 2
    assert _field(reader, "qwen2.rope.freq_base") == 1e6
    tensors = _tensors(reader)
    hf = _hf_weights(model_dir)
    # llama.cpp's qwen2 rotates the split halves as Hugging Face does: rows are written as they are
    for ours, theirs in [
        ("attn_q.weight", "q_proj.weight"),
        ("attn_k.bias", "k_proj.bias"),
        ("attn_q.bias", "q_proj.bias"),
    ]:
        got, want = np.asarray(tensors[f"blk.1.{ours}"].data), hf[f"model.layers.1.self_attn.{theirs}"]
        assert np.array_equal(
            got.astype(np.float32), want.astype(np.float16).astype(np.float32) if want.ndim > 1 else want
        )
    assert np.abs(hf["model.layers.1.self_attn.q_proj.bias"]).max() > 0  # random, so a lost bias is seen
    assert "output.weight" not in tensors  # tied, as qwen2-tiny is


def test_pre_tokenizers_are_recognised_or_refused() -> None:
    smollm = {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, {"type": "ByteLevel"}],
    }
    assert pre_tokenizer_name({"pre_tokenizer": smollm}) == "smollm"
    assert pre_tokenizer_name({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False}}) == "gpt-2"
    assert pre_tokenizer_name({"pre_tokenizer": qwen2_pre_tokenizer()}) == "qwen2"
    with pytest.raises(ConfigError, match="Metaspace"):
        pre_tokenizer_name({"pre_tokenizer": {"type": "Metaspace"}})
    other = qwen2_pre_tokenizer()
    other["pretokenizers"][0]["pattern"] = {"Regex": r"\s+|\S+"}  # type: ignore[index]
    with pytest.raises(ConfigError, match="Qwen2"):
        pre_tokenizer_name({"pre_tokenizer": other})


def test_the_llama_cpp_component_is_named_in_the_skip_reason() -> None:
    """The slow tier's llama.cpp tests skip with a reason CI=true turns into a failure (tests/conftest.py)."""
    from tests.conftest import missing_ci_component
    from tests.unit.test_export_llama_cpp import LLAMA_CPP_MISSING

    assert missing_ci_component(LLAMA_CPP_MISSING) == "'llama_cpp'"


def test_rope_base_is_read_where_transformers_5_writes_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    """transformers 5 saves rope_theta under rope_parameters (SmolLM2's 100000): the file states that base,
    not llama.cpp's default of 10000, and a scaled rope there is refused as it is under rope_scaling."""
    model_dir = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("rope_theta", None)
    config["rope_parameters"] = {"rope_theta": 100000.0, "rope_type": "default"}
    (model_dir / "config.json").write_text(json.dumps(config))
    write_gguf(model_dir, tmp_path / "m.gguf", "f16")
    assert _field(_reader(tmp_path / "m.gguf"), "llama.rope.freq_base") == 100000.0
    config["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 32.0}
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="rope scaling"):
        write_gguf(model_dir, tmp_path / "x.gguf", "f16")


def test_an_untied_output_head_stays_8_bit_in_a_4_bit_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = build_tiny_qwen2(tiny_model_dir, tmp_path / "untied", tied=False)
    write_gguf(model_dir, tmp_path / "q4.gguf", "q4_0")
    tensors = _tensors(_reader(tmp_path / "q4.gguf"))
    assert tensors["output.weight"].tensor_type.name == "Q8_0"
    assert tensors["token_embd.weight"].tensor_type.name == "Q8_0"
    assert tensors["blk.0.ffn_down.weight"].tensor_type.name == "Q4_0"
