"""Schema-constrained decoding for the transformers backend: a per-step token mask from llguidance.

A request whose :attr:`~crl_agent.llm.base.SamplingParams.json_schema` is set gets a
:class:`SchemaConstraint`: an ``llguidance.LLMatcher`` compiled from that JSON Schema, which gives,
before each decoding step, the set of tokens that keep the output a prefix of a valid document; the
engine sets every other logit to ``-inf`` before sampling (:mod:`crl_agent.llm.hf_engine`), so the
reply parses by construction. JSON is compact with ``", "`` and ``": "`` separators (``json.dumps``'s
own), and no other whitespace between tokens: free whitespace lets a small model pad a reply until
its token cap.

llguidance (the library vLLM's ``guidance`` structured-output backend and llama.cpp use) builds its
token tries from the fast tokenizer in Rust; :class:`SchemaCompiler` does that once per backend (~1 s
for a 49k vocabulary) and compiles each request's matcher in a few ms. A mask costs under 1 ms per
token, against ~30 ms for a 135M model's decoding step on a CPU.

**Finishing inside the token cap.** A schema alone does not make a reply parseable: one cut at
``max_tokens`` mid-string is not JSON. So in its last ``close_reserve`` tokens a constrained row
*closes*, following the JSON it has written so far: inside a string it takes the allowed token that
ends the string soonest (one starting with ``"``, best followed only by ``]`` and ``}``); outside
one, the end-of-turn token where the document is complete, else the longest allowed run of ``]``
and ``}``; where neither is allowed (a required key or a non-empty string still to come) the
model's likeliest allowed token. For schemas whose strings and arrays have bounds (the experience
extractor's) that ends a document within a few dozen tokens from any state; the reserve is
``min(64, max_tokens // 2)``.

Log-probs are unaffected: ``Completion.logprobs`` and ``sampling_logprobs`` stay those of the
unmasked model (what a trainer's forward pass recomputes), as they already leave top-p out.
"""

from __future__ import annotations

import json
import threading
from typing import Any

_INSTALL_HINT = 'schema-constrained decoding needs llguidance, part of the agent extra: pip install "crl-bench[agent]"'
# compact JSON as json.dumps writes it: what the prompts show and the parsers read
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_CLOSE_RESERVE = 64
_CLOSERS = frozenset(b"]}")


def _import_llguidance():
    try:
        import llguidance
        import llguidance.hf
    except ImportError as e:
        raise ImportError(_INSTALL_HINT) from e
    return llguidance


def close_reserve(max_new: int) -> int:
    """Tokens at the end of a constrained generation spent closing the document."""
    return min(MAX_CLOSE_RESERVE, max_new // 2)


class SchemaConstraint:
    """One request's matcher: the allowed next tokens, and where the JSON written so far stands."""

    def __init__(self, compiler: SchemaCompiler, matcher: Any):
        self.compiler, self.matcher = compiler, matcher
        self.in_string = False  # the JSON so far ends inside a string
        self._escaped = False

    def allowed(self):
        """Bool tensor over the model's vocabulary: the tokens that may come next."""
        import numpy as np
        import torch

        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.zeros(self.compiler.vocab_size, dtype=bool)
        allowed = np.unpackbits(bits, bitorder="little")[: self.compiler.vocab_size]
        mask[: len(allowed)] = allowed
        return torch.from_numpy(mask)

    def closing_token(self, logits, allowed) -> int:
        """The token that brings the document to its end soonest (see the module docstring)."""
        import torch

        c = self.compiler
        if self.in_string:
            # '"' closes the string: best a token that goes on closing ('"}]}'), else any that starts with it
            ranks = [c.quote_close_len * allowed, c.starts_quote & allowed]
        else:
            eos = [t for t in c.eos_ids if t < len(allowed) and allowed[t]]
            if eos:
                return eos[0]
            ranks = [c.closer_len * allowed]
        for rank in ranks:
            rank = rank.long()
            if bool(rank.any()):  # among the best-ranked tokens, the model's likeliest
                return int(torch.argmax(logits.masked_fill(rank != rank.max(), float("-inf"))))
        return int(torch.argmax(logits.masked_fill(~allowed, float("-inf"))))

    def advance(self, token: int) -> bool:
        """Consume ``token``; False when the grammar rejects it (the matcher is then in error)."""
        if not self.matcher.consume_token(int(token)):
            return False
        for b in self.compiler.token_bytes(token):
            if self._escaped:
                self._escaped = False
            elif self.in_string and b == 0x5C:  # backslash
                self._escaped = True
            elif b == 0x22:  # '"'
                self.in_string = not self.in_string
        return True

    def error(self) -> str:
        return str(self.matcher.get_error() or "")


class SchemaCompiler:
    """Builds :class:`SchemaConstraint` objects for one tokenizer (thread-safe; the llguidance tokenizer is
    built on first use).

    Args:
        hf_tokenizer: a fast Hugging Face tokenizer.
        vocab_size: rows of the model's output layer (may exceed the tokenizer's vocabulary).
        eos_ids: the tokens that end a reply (a complete document allows only these).
        lock: taken while the tokenizer is read (Rust tokenizers fail when threads share one).
    """

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_ids: frozenset[int], lock: Any = None):
        self.hf_tokenizer, self.vocab_size = hf_tokenizer, int(vocab_size)
        self.eos_ids = sorted(int(t) for t in eos_ids) or [int(hf_tokenizer.eos_token_id)]
        self._lock = lock if lock is not None else threading.RLock()
        self._build_lock = threading.Lock()
        self._ll_tokenizer: Any = None
        # per token: its length if made only of ']' and '}'; its length if it is '"' then only ']' and '}';
        # whether it starts with '"' (all 0/False until the tokenizer is built)
        self.closer_len: Any = None
        self.quote_close_len: Any = None
        self.starts_quote: Any = None
        self._bytes: list[bytes] = []

    def _tokenizer(self) -> Any:
        with self._build_lock:
            if self._ll_tokenizer is None:
                import torch

                llguidance = _import_llguidance()
                with self._lock:
                    n_vocab = max(self.vocab_size, len(self.hf_tokenizer))
                    tok = llguidance.hf.from_tokenizer(self.hf_tokenizer, n_vocab=n_vocab, eos_token=self.eos_ids)
                n = min(self.vocab_size, tok.vocab_size)
                self._bytes = [tok.decode_bytes([t]) for t in range(n)] + [b""] * (self.vocab_size - n)
                closer = torch.zeros(self.vocab_size, dtype=torch.long)
                quote_close = torch.zeros(self.vocab_size, dtype=torch.long)
                starts_quote = torch.zeros(self.vocab_size, dtype=torch.bool)
                for t, text in enumerate(self._bytes):
                    if text and set(text) <= _CLOSERS:
                        closer[t] = len(text)
                    if text[:1] == b'"':
                        starts_quote[t] = True
                        if set(text[1:]) <= _CLOSERS:
                            quote_close[t] = len(text)
                self.closer_len, self.quote_close_len, self.starts_quote = closer, quote_close, starts_quote
                self._ll_tokenizer = tok
            return self._ll_tokenizer

    def token_bytes(self, token: int) -> bytes:
        """The bytes token ``token`` writes (empty for special tokens)."""
        return self._bytes[token] if 0 <= token < len(self._bytes) else b""

    def grammar(self, schema: str) -> str:
        """The llguidance grammar of a JSON Schema (JSON text).

        Raises:
            ValueError: not a JSON object, or a schema llguidance cannot compile (the message says why).
        """
        llguidance = _import_llguidance()
        try:
            value = json.loads(schema)
        except ValueError as e:
            raise ValueError(f"SamplingParams.json_schema is not JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError("SamplingParams.json_schema must be a JSON object (a JSON Schema)")
        grammar = llguidance.LLMatcher.grammar_from_json_schema(value, defaults=JSON_OPTIONS)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise ValueError(f"SamplingParams.json_schema cannot be compiled: {messages[0] if messages else '?'}")
        return grammar

    def constraint(self, schema: str) -> SchemaConstraint:
        """A fresh matcher for one request.

        Raises:
            ValueError: as :meth:`grammar`.
        """
        llguidance = _import_llguidance()
        grammar = self.grammar(schema)
        matcher = llguidance.LLMatcher(self._tokenizer(), grammar, log_level=1)
        if matcher.is_error():
            raise ValueError(f"SamplingParams.json_schema cannot be compiled: {matcher.get_error()}")
        return SchemaConstraint(self, matcher)
