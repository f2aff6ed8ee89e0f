"""``POST /v1/completions`` for :mod:`crl_agent.serve`: raw prompts, with ``echo`` and prompt log-probs.

Request fields: ``prompt`` (a string, a list of token ids, or a list of up to 256 of either),
``max_tokens`` (default 16; 0 generates nothing), ``echo``, ``logprobs`` (``null`` or an int 0..20;
``top_logprobs`` entries hold only the chosen token), ``temperature``, ``top_p``, ``stop``, ``seed``,
vLLM's ``return_token_ids``; ``n`` must be 1 and ``stream`` false. Text prompts are tokenized with
no special tokens added (send token ids for exact control).

With ``echo`` and ``logprobs`` every prompt token but the first (``null``) gets its log-prob under
the model: this is how the ``openai`` backend scores candidates (prompt + candidate per prompt).
Prompts that share a prefix have it computed once: its log-probs in one pass, then every prompt's
remainder as candidates after it (one batched forward with the prefix cache). The backend must
offer ``complete_ids``/``score_ids`` (the transformers backend does); others get a 501.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any

from crl_agent.serve_requests import HTTPError, sampling_params_from_request

MAX_PROMPTS = 256
_SURROGATE = re.compile("[\ud800-\udfff]")


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _prompts(body: dict[str, Any], llm: Any) -> list[list[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _is_ids(prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        items = prompt
    else:
        raise HTTPError(400, "prompt must be a string, a non-empty list of token ids, or a non-empty list of either")
    if len(items) > MAX_PROMPTS:
        raise HTTPError(400, f"at most {MAX_PROMPTS} prompts per request, got {len(items)}")
    out = []
    for p in items:
        ids = llm.encode(_SURROGATE.sub("\ufffd", p)) if isinstance(p, str) else list(p)
        if not ids:
            raise HTTPError(400, "a prompt is empty")
        out.append(ids)
    return out


def _common_prefix(prompts: list[list[int]]) -> int:
    n = min(len(p) for p in prompts)
    first = prompts[0]
    for i in range(n):
        if any(p[i] != first[i] for p in prompts[1:]):
            return i
    return n


async def _echo_logprobs(llm: Any, prompts: list[list[int]]) -> list[list[float | None]]:
    """Per prompt, the log-prob of each of its tokens given the ones before (``None`` for the first)."""
    common = _common_prefix(prompts) if len(prompts) > 1 else 0
    if common >= 2 and all(len(p) > common for p in prompts):
        shared = (await llm.score_ids(prompts[0][:1], [prompts[0][1:common]])).token_logprobs[0]
        rest = await llm.score_ids(prompts[0][:common], [p[common:] for p in prompts])
        return [[None, *shared, *lps] for lps in rest.token_logprobs]

    async def one(ids: list[int]) -> list[float | None]:
        if len(ids) == 1:
            return [None]
        return [None, *(await llm.score_ids(ids[:1], [ids[1:]])).token_logprobs[0]]

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def completions_response(server: Any, body: dict[str, Any], client_gone: Any = None) -> dict[str, Any]:
    """Answer one ``/v1/completions`` body for ``server`` (a :class:`crl_agent.serve.ChatServer`)."""
    llm = server.llm
    if not all(hasattr(llm, name) for name in ("complete_ids", "score_ids", "encode", "token_strings")):
        raise HTTPError(501, f"the {llm.name} backend cannot serve /v1/completions; use /v1/chat/completions",
                        "not_implemented")
    echo, logprobs = body.get("echo", False), body.get("logprobs")
    if not isinstance(echo, bool):
        raise HTTPError(400, f"echo must be true or false, got {echo!r}")
    if logprobs is False:
        logprobs = None
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                 or not 0 <= logprobs <= 20):
        raise HTTPError(400, f"logprobs must be null or an integer in [0, 20], got {logprobs!r}")
    max_tokens = body.get("max_tokens", 16)
    if max_tokens is None:
        max_tokens = 16
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise HTTPError(400, f"max_tokens must be an integer >= 0, got {max_tokens!r}")
    params = sampling_params_from_request({**body, "max_tokens": max(1, max_tokens), "max_completion_tokens": None})
    prompts = _prompts(body, llm)

    async def work():
        gens = asyncio.gather(*(llm.complete_ids(p, params) for p in prompts)) if max_tokens > 0 else None
        echoed = await _echo_logprobs(llm, prompts) if echo and logprobs is not None else None
        return (await gens if gens is not None else [None] * len(prompts)), echoed

    completions, echoed = server.wait(work(), client_gone)
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for i, (ids, c) in enumerate(zip(prompts, completions, strict=True)):
        prompt_tokens += len(ids)
        gen_ids = list(c.token_ids) if c is not None else []
        completion_tokens += len(gen_ids)
        text = c.text if c is not None else ""
        choice: dict[str, Any] = {"index": i, "text": text, "logprobs": None,
                                  "finish_reason": c.finish_reason if c is not None else "length"}
        if echo:
            choice["text"] = llm.decode(ids) + text
        if logprobs is not None:
            tokens = (list(ids) if echo else []) + gen_ids
            values = (list(echoed[i]) if echo and echoed is not None else []) + (list(c.logprobs) if c else [])
            strings = llm.token_strings(tokens)
            offsets, at = [], 0
            for s in strings:
                offsets.append(at)
                at += len(s)
            choice["logprobs"] = {
                "tokens": strings,
                "token_logprobs": values,
                "top_logprobs": [None if v is None else {s: v} for s, v in zip(strings, values, strict=True)],
                "text_offset": offsets,
            }
        if body.get("return_token_ids"):
            choice["token_ids"] = gen_ids
            choice["prompt_token_ids"] = list(ids)
        choices.append(choice)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": server.model_name,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }
