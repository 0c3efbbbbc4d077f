"""Tiny random-init models and tokenizers for tests and examples, built offline in seconds.

The tokenizer is a small byte-level BPE trained on the fly with the ChatML special tokens, so
chat templates, EOS handling and prompt masking behave as with real instruct models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rayft.console import ignore_known_warnings
from rayft.models.registry import CHATML_TEMPLATE

ignore_known_warnings()  # saving a model imports DeepSpeed (through accelerate), which would say it fell back to CPU

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]

_CORPUS = [
    "Question: A baker has 12 apples and buys 7 more. How many apples does the baker have?",
    "Answer: The baker has 12 + 7 = <<12+7=19>>19 apples.\n#### 19",
    "You are a helpful assistant. Translate the following into a SQL query.",
    "SELECT name FROM table WHERE age = 30",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 + - * / = < > # $ % .",
    "instruction input output prompt completion system user assistant text messages",
]


def build_tiny_tokenizer(out_dir: str | Path, vocab_size: int = 512, *, chat_template: bool = True) -> Path:
    """Train a byte-level BPE tokenizer on a small built-in corpus and save it (with a ChatML chat
    template unless ``chat_template`` is false)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<|endoftext|>",
    )
    wrapped.chat_template = CHATML_TEMPLATE if chat_template else None
    out = Path(out_dir)
    wrapped.save_pretrained(out)
    return out


def build_tiny_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    vocab_size: int = 512,
) -> Path:
    """Save a random-init Llama-architecture causal LM and its tokenizer to ``out_dir``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    build_tiny_tokenizer(out, vocab_size=vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    return out


def build_tiny_t5(out_dir: str | Path, *, d_model: int = 32, num_layers: int = 2, seed: int = 0) -> Path:
    """Save a random-init T5 v1.1-architecture encoder-decoder (gated feed-forward ``wi_0``/``wi_1``,
    untied head) and its tokenizer, which has no chat template (as T5's has none), to ``out_dir``."""
    from transformers import AutoTokenizer, T5Config

    out = Path(out_dir)
    build_tiny_tokenizer(out, chat_template=False)
    tokenizer = AutoTokenizer.from_pretrained(out)
    config = T5Config(  # type: ignore[call-arg] # the stubs lack PretrainedConfig's keyword arguments
        vocab_size=len(tokenizer), d_model=d_model, d_kv=d_model // 4, d_ff=d_model * 2, num_layers=num_layers,
        num_decoder_layers=num_layers, num_heads=4, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    return save_random_t5(config, tokenizer, out, seed)


def build_tiny_bart(out_dir: str | Path, *, d_model: int = 32, num_layers: int = 2, seed: int = 0) -> Path:
    """Save a random-init BART encoder-decoder (``q_proj``/``k_proj``/``v_proj``/``out_proj`` attention,
    ``fc1``/``fc2`` feed-forward, tied embeddings) and the tiny tokenizer without a chat template to
    ``out_dir``; the decoder starts from EOS, as BART's does."""
    from transformers import AutoTokenizer, BartConfig

    out = Path(out_dir)
    build_tiny_tokenizer(out, chat_template=False)
    tokenizer = AutoTokenizer.from_pretrained(out)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = BartConfig(
        vocab_size=len(tokenizer), d_model=d_model, encoder_layers=num_layers, decoder_layers=num_layers,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=d_model * 2,
        decoder_ffn_dim=d_model * 2, max_position_embeddings=512, bos_token_id=eos, eos_token_id=eos,
        pad_token_id=pad, decoder_start_token_id=eos, forced_eos_token_id=eos,
    )  # fmt: skip
    return save_random_bart(config, tokenizer, out, seed)


def save_random_t5(config: Any, tokenizer: Any, out: Path, seed: int) -> Path:
    """Initialise a T5 from ``config`` with ``seed`` and save it into ``out`` (beside its tokenizer),
    its generation config starting and ending where the tokenizer's pad and EOS tokens say."""
    import torch
    from transformers import T5ForConditionalGeneration

    torch.manual_seed(seed)
    return _save_seq2seq(T5ForConditionalGeneration(config), tokenizer, out, tokenizer.pad_token_id)


def save_random_bart(config: Any, tokenizer: Any, out: Path, seed: int) -> Path:
    """Initialise a BART from ``config`` with ``seed`` and save it into ``out`` (beside its tokenizer)."""
    import torch
    from transformers import BartForConditionalGeneration

    torch.manual_seed(seed)
    return _save_seq2seq(BartForConditionalGeneration(config), tokenizer, out, config.decoder_start_token_id)


def _save_seq2seq(model: Any, tokenizer: Any, out: Path, decoder_start: int) -> Path:
    """Save an encoder-decoder whose generation starts from ``decoder_start`` and ends at the tokenizer's EOS."""
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.decoder_start_token_id = decoder_start
    model.save_pretrained(out, safe_serialization=True)
    return out
