"""LLM backends behind one async interface (:class:`~crl_agent.llm.base.LLM`)."""

from __future__ import annotations

from crl_agent.llm.base import LLM, Completion, LLMError, Message, SamplingParams

__all__ = ["LLM", "Completion", "LLMError", "Message", "SamplingParams"]
