"""A small random-initialised T5 for the built-in text-to-SQL set, built offline in seconds.

Its tokenizer is a byte-level BPE trained on the training split of ``builtin:sql`` (never the test
split), so schema words and SQL keywords are single tokens and a question and its query are short
sequences, with numbers split into digits so that the model copies any value from the question into
the query digit by digit. The model is T5 v1.1's architecture scaled down to 1.3M parameters
(``t5-tiny`` in :mod:`rayft.testing.architectures`, 2+2 layers of width 128, no dropout): on two CPU
cores it takes about three optimizer steps of 64 examples a second, so a few minutes of training are
over a thousand steps. ``configs/t5-sql-cpu.yaml`` fine-tunes it:

    python -m rayft.testing.sql_t5 runs/t5-sql-cpu-model
"""

from __future__ import annotations

import sys
from pathlib import Path

from rayft.data.builtin import load_builtin
from rayft.testing.architectures import architecture_config
from rayft.testing.tiny import save_random_t5

SPECIAL_TOKENS = ["<pad>", "</s>", "<unk>"]  # T5's ids: pad 0 (also the decoder start), EOS 1, unknown 2
SHAPE = {
    "d_model": 128, "d_kv": 32, "d_ff": 512, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
    "dropout_rate": 0.0,  # the generator never repeats an example: nothing to regularise against
}  # fmt: skip


def build_sql_tokenizer(out_dir: str | Path, *, vocab_size: int = 1024, rows: int = 3000) -> Path:
    """Train the tokenizer on the first ``rows`` rows of builtin:sql's train split and save it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [text for row in load_builtin("builtin:sql", "train", rows) for text in (row["input"], row["output"])]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # digits one by one: a number is copied from the question into the query digit by digit, whatever its value
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    out = Path(out_dir)
    wrapped.save_pretrained(out)
    return out


def build_sql_t5(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Save the tokenizer and a random-initialised T5 sized to it to ``out_dir``."""
    from transformers import AutoTokenizer

    out = build_sql_tokenizer(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out)
    config = architecture_config("t5-tiny", vocab_size=len(tokenizer), **SHAPE)
    return save_random_t5(config, tokenizer, out, seed)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m rayft.testing.sql_t5 OUT_DIR")
    print(build_sql_t5(sys.argv[1]))
