"""rayft's GGUF exports run in a real llama.cpp (llama-cpp-python, built from source by ``make
setup-llama``): the f16 file of a tiny random Llama and of SmolLM2-135M-Instruct tokenizes every prompt
as the Hugging Face tokenizer does, gives Hugging Face's logits within the f16 rounding bound, and
decodes Hugging Face's greedy tokens. Slow tier: it needs the compiled binding (CI=true fails, not
skips, without it) and the SmolLM2 case loads the real model."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rayft.export.gguf_file import write_gguf
from tests.support.gguf_models import tiny_family

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is 3 + 4?",
    "Question: Tom has 12 apples and gives away 5. How many are left?\nAnswer:",
    "SELECT name FROM users WHERE age = 30;",
    "  two leading spaces,\n\ttabs and 1234567 digits",
    "naïve café, 東京 and emoji 🙂",
]
NEW_TOKENS = 16
LLAMA_CPP_MISSING = "'llama_cpp' is missing: build llama-cpp-python from source with `make setup-llama`"


@pytest.fixture(scope="module")
def llama_cpp() -> Any:
    """The compiled binding: skipped where it is missing (a failure under CI=true, tests/conftest.py)."""
    return pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)


def chat_prompts(tokenizer: Any) -> list[str]:
    """The plain prompts, and two chats rendered by the model's template (special tokens in the text)."""
    chats = [
        [{"role": "user", "content": "What is 3 + 4?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}],
    ]
    rendered = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    return PROMPTS + rendered


def load_llama(llama_cpp: Any, path: Path) -> Any:
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=512, n_batch=512, n_threads=2, logits_all=True, seed=0, verbose=False
    )


def llama_logits(llm: Any, ids: list[int]) -> np.ndarray:
    """llama.cpp's logits at every position of ``ids`` (one batch, from an empty cache)."""
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float64)


def llama_greedy(llm: Any, ids: list[int], n: int) -> list[int]:
    """``n`` tokens decoded greedily by llama.cpp: its own logits, its KV cache, argmax each step."""
    llm.reset()
    llm.eval(ids)
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out


def hf_greedy(model: Any, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """Hugging Face's ``n`` greedy tokens (EOS not special: both sides decode ``n``) and its logits at
    every position of prompt + tokens."""
    import torch

    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, suppress_tokens=None
        )
        logits = model(out).logits[0].double().numpy()
    return out[0, len(ids) :].tolist(), logits


def f16_tolerance(hf_logits: np.ndarray, layers: int) -> float:
    """How far llama.cpp's logits may be from Hugging Face's float32 ones over the same f16 weights.

    llama.cpp rounds the activations entering each f16 matrix product to f16 (unit roundoff
    u = 2^-11), so each product errs by up to u relative to its output's scale; there are two such
    stages per layer (attention, MLP) and the head, and to first order their relative errors add:
    (2 x layers + 1) x u x the largest logit. Float32 accumulation order adds ~1e-7 relative, far below.
    """
    return (2 * layers + 1) * 2.0**-11 * float(np.abs(hf_logits).max())


def check_file(llama_cpp: Any, model_dir: Path, gguf: Path) -> dict[str, int]:
    """Tokens, logits and greedy tokens of ``gguf`` in llama.cpp against the Hugging Face model of
    ``model_dir`` (its weights rounded to f16 as the file holds them, computed in float32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # as the file holds them: matrices in float16, norms and biases in float32
        for parameter in hf.parameters():
            if parameter.ndim > 1:
                parameter.copy_(parameter.half().float())
    llm = load_llama(llama_cpp, gguf)
    with contextlib.closing(llm):
        return _compare(llm, tokenizer, hf)


def _compare(llm: Any, tokenizer: Any, hf: Any) -> dict[str, int]:
    equal = near_ties = 0
    for prompt in chat_prompts(tokenizer):
        ids = tokenizer(prompt)["input_ids"]
        assert llm.tokenize(prompt.encode(), add_bos=True, special=True) == ids, prompt
        assert llm.detokenize(ids, special=True).decode() == tokenizer.decode(ids), prompt
        want, hf_logits = hf_greedy(hf, ids, NEW_TOKENS)
        ours = llama_logits(llm, ids + want)
        tolerance = f16_tolerance(hf_logits, hf.config.num_hidden_layers)
        worst = float(np.abs(ours - hf_logits).max())
        assert worst <= tolerance, f"{prompt!r}: llama.cpp's logits differ from HF's by {worst:.3g} > {tolerance:.3g}"
        got = llama_greedy(llm, ids, NEW_TOKENS)
        if got == want:
            equal += 1
            continue
        # Where the two decodings part (same prefix), each logit of llama.cpp's is within `worst` of
        # Hugging Face's, so it can prefer another token only if Hugging Face's own margin between the two
        # is at most 2 x worst: a tie the two computations do not decide alike, not a conversion error.
        k = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
        step = hf_logits[len(ids) - 1 + k]
        gap = float(step[want[k]] - step[got[k]])
        assert gap <= 2 * worst, f"{prompt!r}: token {k} is {got[k]} in llama.cpp, {want[k]} in HF (margin {gap:.3g})"
        near_ties += 1
    return {"equal": equal, "near_ties": near_ties}


@pytest.mark.parametrize("family", ["llama", "llama-smollm", "qwen2"])
def test_tiny_f16_runs_in_llama_cpp_as_in_hugging_face(
    llama_cpp: Any, tiny_model_dir: Path, tmp_path: Path, family: str
) -> None:
    model_dir = tiny_family(family, tiny_model_dir, tmp_path / "m")
    write_gguf(model_dir, tmp_path / "m-f16.gguf", "f16")
    result = check_file(llama_cpp, model_dir, tmp_path / "m-f16.gguf")
    assert result["equal"] >= len(PROMPTS)


def test_smollm2_f16_runs_in_llama_cpp_as_in_hugging_face(llama_cpp: Any, tmp_path: Path) -> None:
    from rayft.models.loading import ensure_builtin_model

    model_dir = tmp_path / "smollm2"
    shutil.copytree(ensure_builtin_model("smollm2-135m-instruct"), model_dir)
    write_gguf(model_dir, tmp_path / "smollm2-f16.gguf", "f16")
    result = check_file(llama_cpp, model_dir, tmp_path / "smollm2-f16.gguf")
    assert result["equal"] >= len(PROMPTS)


@pytest.mark.parametrize("gguf_type", ["q8_0", "q4_0"])
def test_quantized_tensors_are_llama_cpp_own_quantization(
    llama_cpp: Any, tiny_model_dir: Path, tmp_path: Path, gguf_type: str
) -> None:
    """Our q8_0 / q4_0 blocks are bit for bit what llama.cpp's ``llama_model_quantize`` makes of the same
    values. llama.cpp quantizes from the f16 file and rayft from float32, so the weights are made
    f16-exact first; the tensors whose type both choose (every block weight) are compared."""
    import ctypes

    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    model_dir = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.half().float())
    model.save_pretrained(model_dir)
    write_gguf(model_dir, tmp_path / "f16.gguf", "f16")
    write_gguf(model_dir, tmp_path / "ours.gguf", gguf_type)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}[gguf_type]
    params.nthread = 1
    theirs_path = str(tmp_path / "theirs.gguf").encode()
    assert llama_cpp.llama_model_quantize(str(tmp_path / "f16.gguf").encode(), theirs_path, ctypes.byref(params)) == 0
    ours = {t.name: t for t in gguf.GGUFReader(tmp_path / "ours.gguf").tensors}
    theirs = {t.name: t for t in gguf.GGUFReader(tmp_path / "theirs.gguf").tensors}
    assert set(ours) == set(theirs)
    blocks = [name for name in ours if name.startswith("blk.") and ours[name].data.ndim > 1]
    for name in blocks:
        assert ours[name].tensor_type == theirs[name].tensor_type, name
        assert np.array_equal(np.asarray(ours[name].data), np.asarray(theirs[name].data)), name
    assert {ours[n].tensor_type.name for n in blocks} == {gguf_type.upper()}
