"""The one async interface every LLM backend implements.

A backend turns a chat (a list of ``{"role": ..., "content": ...}`` messages) into a
:class:`Completion` that carries the text *and* what a trainer needs later: the prompt's and
the completion's token ids and the per-token log-probs of the sampled tokens.

Backends (``transformers``, ``vllm``, ``openai``) live next to this module and are built by
:func:`crl_agent.llm.make_llm`. Agents, the experience extractor and the trainer only ever
see :class:`LLM`.
"""

from __future__ import annotations

import abc
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    Attributes:
        max_tokens: cap on generated tokens.
        temperature: 0 means greedy.
        top_p: nucleus sampling mass.
        stop: strings that end the completion; the stop string itself is not returned.
        seed: per-request sampling seed (``None``: the backend's own stream).
    """

    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


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
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    prompt_tokens: int = 0
    finish_reason: str = "stop"
    model: str = ""
    reported_completion_tokens: int | None = None

    @property
    def completion_tokens(self) -> int:
        if self.token_ids:
            return len(self.token_ids)
        return int(self.reported_completion_tokens or 0)


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
    return params


class LLMError(RuntimeError):
    """A backend could not produce a completion (after its retries)."""


class ContextLengthError(LLMError):
    """The prompt cannot fit the model's context, even after dropping old turns (the caller's to fix)."""


class LLM(abc.ABC):
    """An async chat-completion backend.

    Concurrent ``chat`` calls are expected: backends batch or pipeline them.
    """

    name: str = "llm"

    @abc.abstractmethod
    async def chat(self, messages: list[Message], params: SamplingParams | None = None) -> Completion:
        """Complete one chat."""

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` (backends with a tokenizer override this estimate of ~4 chars a token)."""
        return max(1, (len(text) + 3) // 4) if text else 0

    def config(self) -> dict[str, Any]:
        """A JSON-serialisable description for ``summary.json`` (never secrets)."""
        return {"backend": self.name}

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release the model, threads or HTTP connections."""
