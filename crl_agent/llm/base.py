"""The one async interface every LLM backend implements.

A backend turns a chat (a list of ``{"role": ..., "content": ...}`` messages) into a
:class:`Completion` that carries the text *and* what a trainer needs later: the prompt's and
the completion's token ids and the per-token log-probs of the sampled tokens.

The interface, in full:

- ``await llm.chat(messages, SamplingParams) -> Completion``: sample one reply.
- ``await llm.score(messages, candidates, norm="sum") -> list[float]``: the log-probability of
  each candidate written as the assistant's complete reply (GLAM-style action scoring); ``"mean"``
  divides by each candidate's token count. ``await llm.score_full(messages, candidates)`` returns
  a :class:`ScoreResult` with the exact token ids scored, for a trainer that must recompute the
  same log-probs with gradients (never re-tokenise). Candidate rules (:func:`check_candidates`):
  a non-empty list of at most :data:`MAX_CANDIDATES` strings; duplicates are scored once and every
  copy gets the same score (a softmax over them counts that action twice: dedupe first if that is
  not wanted); lone surrogates become U+FFFD; text that looks like a special token
  (``"<|im_end|>"``) is scored as plain text, never as the control token. Backends that cannot
  score raise :class:`ScoringUnsupported` (use ``action_mode=generate``).
- ``llm.policy_version``: an int stamped into every :class:`Completion` and :class:`ScoreResult`;
  ``llm.bump_policy_version()`` increments it after a weight update and drops whatever the backend
  cached from the old weights (the transformers backend's prefix KV cache).
- ``llm.count_tokens(text)``, ``llm.config()``, ``await llm.aclose()``.

Backends (``transformers``, ``vllm``, ``openai``) live next to this module and are built by
:func:`crl_agent.llm.make_llm`. Agents, the experience extractor and the trainer only ever
see :class:`LLM`.
"""

from __future__ import annotations

import abc
import json
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    Attributes:
        max_tokens: cap on generated tokens.
        temperature: 0 means greedy.
        top_p: nucleus sampling mass.
        stop: strings that end the completion; the stop string itself is not returned.
        seed: per-request sampling seed (``None``: the backend's own stream).
        json_schema: a JSON Schema the reply must follow, as JSON text (a dict is accepted and stored as
            ``json.dumps`` of it). The transformers backend masks every token that would break it
            (:mod:`crl_agent.llm.constrained`), vLLM uses its structured outputs, the openai backend
            sends ``response_format`` where the server takes it. Replies are compact JSON
            (``", "`` and ``": "`` separators); a caller still checks what they mean.
    """

    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    json_schema: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.json_schema, Mapping):  # frozen: stored as text, so params stay hashable
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))


@dataclass
class Completion:
    """One sampled completion.

    Attributes:
        text: the completion text (stop string removed).
        token_ids: ids of the generated tokens (may be empty where a server does not return them).
        logprobs: log-prob of each generated token under the sampling model, aligned with
            ``token_ids`` (may be empty where the server does not return them).
        prompt_token_ids: ids of the rendered prompt (chat template applied), where known.
        prompt_tokens: number of prompt tokens (always set).
        finish_reason: ``"stop"`` (EOS or a stop string) or ``"length"``.
        model: which model produced it.
        reported_completion_tokens: the server's count of generated tokens, for backends that
            return no token ids (``completion_tokens`` falls back to it).
        policy_version: the backend's :attr:`LLM.policy_version` when it was sampled.
        sampling_logprobs: log-prob of each generated token under the distribution it was drawn from,
            ``softmax(logits / temperature)`` (top-p truncation not included; greedy decoding: the
            unmodified one): the old log-probs an importance ratio needs. Equal to ``logprobs`` at
            temperature 1; empty where a backend does not report them.
        model_chosen: for each generated token, whether the model chose it: ``False`` where a JSON schema
            allowed that one token only, or the schema's closing phase picked it deterministically
            (:mod:`crl_agent.llm.constrained`). A trainer leaves those out of the loss: no choice, no
            credit. Empty where a backend does not know (every token then counts as chosen).
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    prompt_tokens: int = 0
    finish_reason: str = "stop"
    model: str = ""
    reported_completion_tokens: int | None = None
    policy_version: int = 0
    sampling_logprobs: list[float] = field(default_factory=list)
    model_chosen: list[bool] = field(default_factory=list)

    @property
    def completion_tokens(self) -> int:
        if self.token_ids:
            return len(self.token_ids)
        return int(self.reported_completion_tokens or 0)


@dataclass
class ScoreResult:
    """Log-probabilities of candidate replies to one prompt (see :meth:`LLM.score_full`).

    Attributes:
        logprobs: per candidate, the summed log-prob of its tokens (candidate text, then the
            end-of-turn token) given the prompt, under the unmodified model (temperature 1).
        token_counts: per candidate, how many tokens were scored (``len(candidate_token_ids[i])``).
        prompt_token_ids: the rendered prompt (chat template, generation prompt added, old turns
            dropped if the context required it); empty where a server does not expose ids.
        candidate_token_ids: per candidate, the scored ids (end-of-turn token included).
        token_logprobs: per candidate, the log-prob of each of its tokens (may be empty where a
            backend only returns sums).
        model: which model scored them.
        policy_version: the backend's :attr:`LLM.policy_version` when they were scored.
    """

    logprobs: list[float]
    token_counts: list[int]
    prompt_token_ids: list[int]
    candidate_token_ids: list[list[int]]
    token_logprobs: list[list[float]] = field(default_factory=list)
    model: str = ""
    policy_version: int = 0

    def normalised(self, norm: str = "sum") -> list[float]:
        """``logprobs`` as they are (``"sum"``) or divided by each candidate's token count (``"mean"``)."""
        check_norm(norm)
        if norm == "sum":
            return list(self.logprobs)
        return [lp / max(1, n) for lp, n in zip(self.logprobs, self.token_counts, strict=True)]


MAX_CANDIDATES = 10_000
_NORMS = ("sum", "mean")


def check_norm(norm: str) -> str:
    """Return ``norm`` when it is ``"sum"`` or ``"mean"``; raise ``ValueError`` otherwise."""
    if norm not in _NORMS:
        raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
    return norm


def check_candidates(candidates: Any) -> list[str]:
    """Validate a candidate list for scoring; return it as a list of strings.

    Lone UTF-16 surrogates (which no tokenizer can encode) become U+FFFD, as in messages.

    Raises:
        ValueError: not a list/tuple of strings, empty, or longer than :data:`MAX_CANDIDATES`.
    """
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, (list, tuple)):
        raise ValueError(f"candidates must be a list of strings, got {type(candidates).__name__}")
    if not candidates:
        raise ValueError("candidates is empty: there is nothing to score (an env listing no admissible actions "
                         "needs action_mode=generate)")
    if len(candidates) > MAX_CANDIDATES:
        raise ValueError(f"{len(candidates)} candidates is over the limit of {MAX_CANDIDATES}")
    out = []
    for i, c in enumerate(candidates):
        if not isinstance(c, str):
            raise ValueError(f"candidates[{i}] must be a string, got {type(c).__name__}: {str(c)[:100]}")
        out.append(c if c.isascii() else _SURROGATE.sub("\ufffd", c))
    return out


def check_sampling_params(params: SamplingParams) -> SamplingParams:
    """Return ``params`` when every field is usable; raise ``ValueError`` naming the bad one.

    Local backends call this before queueing a request, so one bad request fails alone instead
    of failing (or poisoning with NaNs) the batch it would have joined.
    """
    def bad(what: str) -> ValueError:
        return ValueError(f"SamplingParams.{what}, got {params!r}")

    def integer(v: object) -> bool:  # numpy integers count; bools do not
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    def real(v: object) -> bool:
        return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)

    if not integer(params.max_tokens) or params.max_tokens < 1:
        raise bad("max_tokens must be an int >= 1")
    if not real(params.temperature) or params.temperature < 0:
        raise bad("temperature must be a finite number >= 0")
    if not real(params.top_p) or not 0 < params.top_p <= 1:
        raise bad("top_p must be in (0, 1]")
    if not isinstance(params.stop, (tuple, list)) or not all(isinstance(s, str) for s in params.stop):
        raise bad("stop must be a tuple of strings")
    if params.seed is not None and not integer(params.seed):
        raise bad("seed must be an int or None")
    if params.json_schema is not None:
        try:
            schema = json.loads(params.json_schema) if isinstance(params.json_schema, str) else None
        except ValueError:
            schema = None
        if not isinstance(schema, dict):
            raise bad("json_schema must be a JSON Schema object (a dict or its JSON text) or None")
    return params


class LLMError(RuntimeError):
    """A backend could not produce a completion (after its retries)."""


class ContextLengthError(LLMError):
    """The prompt cannot fit the model's context, even after dropping old turns (the caller's to fix)."""


class ScoringUnsupported(LLMError):
    """This backend (or the server behind it) cannot score candidates: use ``action_mode=generate``."""


class LLM(abc.ABC):
    """An async chat-completion backend.

    Concurrent ``chat`` calls are expected: backends batch or pipeline them.
    """

    name: str = "llm"
    policy_version: int = 0

    @abc.abstractmethod
    async def chat(self, messages: list[Message], params: SamplingParams | None = None) -> Completion:
        """Complete one chat."""

    async def score_full(self, messages: list[Message], candidates: list[str]) -> ScoreResult:
        """Score each candidate as the assistant's complete reply to ``messages``.

        Raises:
            ValueError: bad messages or candidates (see :func:`check_candidates`).
            ContextLengthError: the prompt cannot fit even after dropping old turns.
            ScoringUnsupported: this backend cannot score.
        """
        raise ScoringUnsupported(f"the {self.name} backend cannot score candidates; use action_mode=generate")

    async def score(self, messages: list[Message], candidates: list[str], *, norm: str = "sum") -> list[float]:
        """Log-prob of each candidate as the assistant's reply; ``norm="mean"`` divides by its token count."""
        check_norm(norm)
        return (await self.score_full(messages, candidates)).normalised(norm)

    def bump_policy_version(self) -> int:
        """Call after the weights changed: increments :attr:`policy_version`, drops stale caches, returns it."""
        self.policy_version = int(self.policy_version) + 1
        self._weights_changed()
        return self.policy_version

    def set_policy_version(self, version: int) -> None:
        """Set :attr:`policy_version` after weights were loaded (e.g. a resumed trainer's), dropping stale caches."""
        self.policy_version = int(version)
        self._weights_changed()

    def _weights_changed(self) -> None:  # noqa: B027 - optional hook
        """Backends drop whatever they cached from the old weights (called by :meth:`bump_policy_version`)."""

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` (backends with a tokenizer override this estimate of ~4 chars a token)."""
        return max(1, (len(text) + 3) // 4) if text else 0

    def config(self) -> dict[str, Any]:
        """A JSON-serialisable description for ``summary.json`` (never secrets)."""
        return {"backend": self.name}

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release the model, threads or HTTP connections."""
