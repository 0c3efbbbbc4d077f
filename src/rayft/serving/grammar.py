"""Constrained decoding for ``rayft serve``: a request's output held to a grammar, token by token.

``response_format`` (``json_object``, ``json_schema``) and forced tool calls (``tool_choice``
``required`` or a named function) become a grammar (:class:`~rayft.serving.guides.Guide`);
:class:`GrammarCompiler` compiles it for the replica's tokenizer into a :class:`Matcher`, which gives
the row's sampler the tokens allowed at each step (:mod:`.sampling`) and takes the token picked. Rows
of one running batch each keep their own matcher, so constrained and free rows decode together.

Why llguidance, and not by hand: a JSON Schema grammar over a BPE vocabulary (tokens that span
several JSON lexemes, strings with escapes, bounded integers) is a parser generator's work, and
llguidance does it in Rust on CPU at about 20 µs per token on SmolLM2's 49152-token vocabulary
(0.02 % of a 2-CPU decoding step). It was chosen against xgrammar and outlines-core by
``benchmarks/bench_grammar_libraries.py`` (``docs/performance.md``, "Structured outputs"): xgrammar
decodes faster per token but installs Triton with it, and outlines-core compiles a regular expression
(no ``json_object`` of any depth) at about 60 ms per schema and 290 µs per token on SmolLM2. It is
an optional extra (``pip install 'rayft[structured]'``); without it a constrained request is refused.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from rayft.serving.guides import Guide
from rayft.serving.protocol import RequestError

if TYPE_CHECKING:
    import torch


class GrammarCompiler:
    """Compiles :class:`Guide` grammars for one tokenizer (its vocabulary read once, on first use)."""

    def __init__(self, tokenizer: Any, eos_ids: set[int]) -> None:
        self.tokenizer, self.eos_ids = tokenizer, sorted(eos_ids)
        self._info: Any = None
        self._lock = threading.Lock()

    def _tokenizer_info(self) -> Any:
        with self._lock:
            if self._info is None:
                import llguidance.hf

                self._info = llguidance.hf.from_tokenizer(self.tokenizer, eos_token=self.eos_ids)
            return self._info

    def matcher(self, guide: Guide) -> Matcher:
        """A fresh matcher of ``guide`` for one row; a :class:`RequestError` (400) when the library cannot
        compile the schema (an unsupported keyword, a bad type), naming the field."""
        try:
            import llguidance
        except ImportError:
            raise RequestError(
                400, f"{guide.param}: constrained decoding needs llguidance on the server; install "
                "'rayft[structured]' where rayft serve runs, or leave the field out", guide.param,
            ) from None  # fmt: skip
        matcher = llguidance.LLMatcher(self._tokenizer_info(), guide.grammar())
        if matcher.is_error():
            reason = matcher.get_error().strip().splitlines()[0][:300]
            raise RequestError(400, f"{guide.param}: the schema cannot be enforced ({reason}); fix or simplify "
                               "the schema", guide.param)  # fmt: skip
        return Matcher(matcher, self.eos_ids)


class Matcher:
    """One row's grammar state (a :class:`~rayft.serving.sampling.Constraint`)."""

    def __init__(self, matcher: Any, eos_ids: list[int]) -> None:
        self.matcher, self.eos_ids = matcher, eos_ids

    def allowed(self, width: int) -> torch.Tensor:
        """The tokens that keep the output a prefix of the grammar's language; only the end of sequence once
        it is complete (or, should the matcher fail, so that the row ends rather than run on unguarded)."""
        import numpy as np
        import torch

        allowed = np.zeros(width, dtype=np.bool_)
        if not self.matcher.is_error():
            bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
            size = min(width, int(bits.shape[0]))
            allowed[:size] = bits[:size]
        if not allowed.any():
            allowed[self.eos_ids] = True
        return torch.from_numpy(allowed)

    def advance(self, token: int) -> None:
        """Take the row's picked token (an end of sequence ends the grammar too)."""
        if not self.matcher.is_error() and not self.matcher.is_stopped():
            self.matcher.consume_token(token)
