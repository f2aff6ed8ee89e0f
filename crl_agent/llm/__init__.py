"""LLM backends behind one async interface (:class:`~crl_agent.llm.base.LLM`).

Build one with :func:`make_llm`::

    llm = make_llm("transformers")                        # packaged SmolLM2-135M on CPU
    llm = make_llm("transformers", model="/models/qwen")  # any local HF model directory
    llm = make_llm("openai", model="Qwen/Qwen2.5-7B-Instruct", base_url="http://gpu:8000/v1")
    llm = make_llm("vllm", model="/models/qwen", gpu_memory_utilization=0.6)
    completion = await llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=32))
    logprobs = await llm.score(messages, ["north", "south", "east"])      # one per candidate reply

Backends are imported lazily: torch, httpx and vLLM load only when their backend is built.
"""

from __future__ import annotations

import importlib
from typing import Any

from crl_agent.llm.base import (
    LLM,
    Completion,
    ContextLengthError,
    LLMError,
    Message,
    SamplingParams,
    ScoreResult,
    ScoringUnsupported,
    check_candidates,
    check_sampling_params,
)

BACKENDS = {
    "transformers": "crl_agent.llm.transformers_backend:TransformersLLM",
    "openai": "crl_agent.llm.openai_backend:OpenAILLM",
    "vllm": "crl_agent.llm.vllm_backend:VLLMLLM",
}


def make_llm(backend: str = "transformers", model: str | None = None, **kwargs: Any) -> LLM:
    """Build an LLM backend by name.

    Args:
        backend: ``"transformers"``, ``"openai"`` or ``"vllm"``.
        model: a local model directory (``transformers``/``vllm``; ``None`` is the packaged
            SmolLM2 for ``transformers``) or the server's model name (``openai``).
        **kwargs: backend options (see each backend class).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown LLM backend {backend!r}: use one of {sorted(BACKENDS)}")
    module, _, cls = BACKENDS[backend].partition(":")
    return getattr(importlib.import_module(module), cls)(model, **kwargs)


__all__ = [
    "BACKENDS",
    "LLM",
    "Completion",
    "ContextLengthError",
    "LLMError",
    "Message",
    "SamplingParams",
    "ScoreResult",
    "ScoringUnsupported",
    "check_candidates",
    "check_sampling_params",
    "make_llm",
]
