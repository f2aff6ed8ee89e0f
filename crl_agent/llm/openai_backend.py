"""``openai`` backend: any OpenAI-compatible chat-completions server.

Works with ``vllm serve``, SGLang, the llama.cpp server, hosted APIs and our own
``python -m crl_agent.serve``. Requests go through ``httpx`` with a per-attempt timeout and
retries with exponential backoff (plus jitter, honouring ``Retry-After`` up to ``max_backoff_s``) on
connection errors, timeouts, connections closed mid-answer, 408/409/425/429 and 5xx answers (except
501 and 505). Other 4xx answers fail at once with an :class:`~crl_agent.llm.base.LLMError` naming
the status and the server's message.

``timeout`` bounds each whole attempt (connect, send, and reading the full answer), so a server
that accepts and never answers, or trickles bytes, costs at most ``timeout`` per attempt and
``(max_retries + 1) * timeout`` plus the backoff delays in all. Answers are read as a stream and
capped at ``max_response_bytes``; a bigger one fails at once instead of filling memory.

What a 2xx answer must hold: a JSON object with a non-empty ``choices`` list whose first item
has a ``message`` object; anything else (invalid JSON, no ``choices``, ``choices: []``) is an
``LLMError`` and is not retried. Optional parts degrade gracefully: ``content: null`` (a refusal
or tool call) gives ``text == ""``, missing or malformed ``logprobs`` give ``logprobs == []``,
and missing or malformed ``usage`` give ``prompt_tokens == 0`` and ``completion_tokens == 0``.

The API key is read from the environment (``OPENAI_API_KEY`` by default, or the variable named
by ``api_key_env``) when the backend is built; it is sent as a bearer token and never logged,
never put in :meth:`OpenAILLM.config` or ``repr``; a server that echoes it in an error message has
it replaced by ``***`` before the message reaches an exception or a log record.

Log-probs are requested (``logprobs: true``) and parsed from ``choices[0].logprobs.content``
when the server returns them. Token ids come back only from servers that return them
(``choices[0].token_ids``, as vLLM does with ``return_token_ids``; ``"token_id:N"`` token
strings, as vLLM does with ``return_tokens_as_token_ids``); elsewhere ``token_ids`` is empty
and ``Completion.completion_tokens`` falls back to the server's ``usage``.

``SamplingParams.json_schema`` is sent as ``response_format: {"type": "json_schema", "json_schema":
{"name": ..., "schema": ..., "strict": true}}`` (OpenAI, vLLM, SGLang and llama.cpp's server take it).
A server that answers 400/422 with a message naming ``response_format`` or ``json_schema`` is asked
again without it, and never sent it again (:attr:`OpenAILLM.response_format_supported` turns False,
logged once): the reply is then free text and the caller's lenient parser reads it, as before.

Scoring (:meth:`OpenAILLM.score_full`) needs the served model's tokenizer here
(``tokenizer=<local HF tokenizer or model directory>``, or ``"smollm2"``): the chat template is
applied client-side and each ``prompt + candidate + end-of-turn`` is sent as token ids to
``POST /completions`` with ``echo: true, logprobs: 1, max_tokens: 1`` (vLLM, SGLang and
``crl_agent.serve`` answer it; prefix caching on the server makes the shared prompt cheap). The
echoed prompt log-probs of the candidate's tokens are summed. Without ``tokenizer``, or when the
server refuses the request or returns no echoed log-probs, scoring raises
:class:`~crl_agent.llm.base.ScoringUnsupported`, whose message says to use ``action_mode=generate``.
The prompt is not shortened here (the server's context is unknown): a server's context-length
error is reported as an ``LLMError``.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import os
import random
import time
from typing import Any

from crl_agent.llm.base import (
    LLM,
    Completion,
    LLMError,
    Message,
    SamplingParams,
    ScoreResult,
    ScoringUnsupported,
    check_candidates,
    check_sampling_params,
)

log = logging.getLogger(__name__)
_RETRY_4XX = frozenset({408, 409, 425, 429})
_PERMANENT_5XX = frozenset({501, 505})  # not implemented / HTTP version: asking again cannot help
_SCORE_CHUNK = 64  # prompts per /completions request
_USE_GENERATE = "use action_mode=generate"


class _HTTPStatusError(LLMError):
    """A non-retryable HTTP answer (carries its status)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _retryable(status: int) -> bool:
    """Transient answers: timeouts, conflicts, rate limits and 5xx overloads (incl. proxies' 52x and 529)."""
    return status in _RETRY_4XX or (status >= 500 and status not in _PERMANENT_5XX)


def _import_httpx():
    try:
        import httpx
    except ImportError as e:
        raise ImportError('the openai backend needs httpx: pip install "crl-bench[agent]"') from e
    return httpx


class OpenAILLM(LLM):
    """A chat-completions client for an OpenAI-compatible server.

    Args:
        model: the server's model name (``GET /v1/models`` lists them; ``None`` asks the server
            and takes the first one on the first call).
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        api_key_env: the environment variable holding the API key (none needed for local servers).
        timeout: seconds one attempt may take in all (connect, send, read the whole answer).
        max_retries: retries after the first attempt.
        backoff_s: first retry delay; doubles each retry, capped at ``max_backoff_s``.
        max_backoff_s: cap on one retry delay.
        max_concurrency: most requests in flight at once.
        logprobs: request token log-probs (turn off for servers that reject the field).
        return_token_ids: ask for token ids (vLLM's ``return_token_ids``; our server honours it).
        extra_body: extra JSON fields sent with every request (e.g. ``{"top_k": 20}``).
        max_response_bytes: largest answer body read; a bigger one is an ``LLMError``.
        tokenizer: a local directory holding the served model's tokenizer (or ``"smollm2"`` for the
            packaged one); needed only by :meth:`score_full`.
    """

    name = "openai"

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str = "http://127.0.0.1:8000/v1",
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 16.0,
        max_concurrency: int = 64,
        logprobs: bool = True,
        return_token_ids: bool = False,
        extra_body: dict[str, Any] | None = None,
        max_response_bytes: int = 64 * 2**20,
        tokenizer: str | None = None,
    ):
        self._httpx = _import_httpx()
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        if not self.base_url.lower().startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, e.g. http://127.0.0.1:8000/v1; got "
                             f"{self.base_url!r}")
        key = (os.environ.get(api_key_env) or "").strip()  # a key read from a file often ends in a newline
        if key and not (key.isascii() and key.isprintable()):
            raise ValueError(f"${api_key_env} holds non-ASCII or control characters, which an HTTP header cannot "
                             "carry; check how the variable is set (its value is not shown)")
        self.__api_key = _Secret(key)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.max_concurrency = int(max_concurrency)
        self.logprobs = logprobs
        self.return_token_ids = return_token_ids
        self.extra_body = dict(extra_body or {})
        self.max_response_bytes = int(max_response_bytes)
        if not (self.timeout > 0 and self.max_retries >= 0 and self.max_response_bytes >= 1
                and self.max_concurrency >= 1 and self.backoff_s >= 0 and self.max_backoff_s >= 0):
            raise ValueError("need timeout > 0, max_retries >= 0, max_response_bytes >= 1, max_concurrency >= 1 "
                             "and backoff_s, max_backoff_s >= 0")
        self.tokenizer_path = tokenizer
        self._tokenizer: Any = None
        self._end_of_turn: list[int] = []
        self._client = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None
        # None: not tried yet; False: the server refused response_format once, so schemas are not sent
        self.response_format_supported: bool | None = None

    def __repr__(self) -> str:
        return f"OpenAILLM(model={self.model!r}, base_url={self.base_url!r}, api_key_env={self.api_key_env!r})"

    # ------------------------------------------------------------------ public
    async def chat(self, messages: list[Message], params: SamplingParams | None = None) -> Completion:
        params = check_sampling_params(params or SamplingParams())
        model = self.model or await self._default_model()
        body: dict[str, Any] = {
            **self.extra_body,
            "model": model,
            "messages": messages,
            "max_tokens": int(params.max_tokens),
            "temperature": float(params.temperature),
            "top_p": float(params.top_p),
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = int(params.seed)
        if self.logprobs:
            body["logprobs"] = True
        if self.return_token_ids:
            body["return_token_ids"] = True
        try:
            json.dumps(body, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"the request cannot be sent as JSON (check messages and extra_body): {e}") from None
        if params.json_schema is None or self.response_format_supported is False:
            data = await self._request("POST", "/chat/completions", body)
            return self._parse(data, model)
        try:
            data = await self._request("POST", "/chat/completions", {**body, "response_format": _response_format(
                params.json_schema)})
        except _HTTPStatusError as e:
            if not _refuses_response_format(e):
                raise
            if self.response_format_supported is not False:
                log.warning("%s does not take response_format json_schema (%s); replies are unconstrained from now on",
                            self.base_url, str(e)[:200])
            self.response_format_supported = False
            data = await self._request("POST", "/chat/completions", body)
        else:
            self.response_format_supported = True
        return self._parse(data, model)

    async def score_full(self, messages: list[Message], candidates: list[str]) -> ScoreResult:
        from crl_agent.llm.chat_tokens import candidate_token_ids, render_chat_ids
        from crl_agent.llm.transformers_backend import validate_messages

        messages = validate_messages(messages)
        cands = check_candidates(candidates)
        tok = self._load_tokenizer()
        prompt = render_chat_ids(tok, messages)
        unique = list(dict.fromkeys(cands))
        ids = {c: candidate_token_ids(tok, c, self._end_of_turn) for c in unique}
        model = self.model or await self._default_model()
        chunks = [unique[i : i + _SCORE_CHUNK] for i in range(0, len(unique), _SCORE_CHUNK)]
        parts = await asyncio.gather(*(self._score_chunk(model, prompt, [ids[c] for c in ch]) for ch in chunks))
        token_lps = dict(zip(unique, [lps for part in parts for lps in part], strict=True))
        return ScoreResult(
            logprobs=[float(sum(token_lps[c])) for c in cands],
            token_counts=[len(ids[c]) for c in cands],
            prompt_token_ids=prompt,
            candidate_token_ids=[list(ids[c]) for c in cands],
            token_logprobs=[list(token_lps[c]) for c in cands],
            model=model,
            policy_version=self.policy_version,
        )

    def _load_tokenizer(self):
        if self._tokenizer is not None:
            return self._tokenizer
        if not self.tokenizer_path:
            raise ScoringUnsupported(
                "scoring through the openai backend needs the served model's tokenizer here: pass "
                "tokenizer=<local tokenizer or model directory> (--agent-arg tokenizer=DIR), or "
                f"{_USE_GENERATE}")
        try:
            from transformers import AutoTokenizer

            from crl_agent.llm.chat_tokens import find_end_of_turn
            from crl_agent.llm.models import resolve_model_path
        except ImportError as e:
            raise ImportError('scoring with a local tokenizer needs transformers: pip install "crl-bench[agent]"') from e
        path, _ = resolve_model_path(self.tokenizer_path)
        tok = AutoTokenizer.from_pretrained(path)
        if not tok.chat_template:
            raise ScoringUnsupported(f"the tokenizer in {path} has no chat template; {_USE_GENERATE}")
        self._end_of_turn = find_end_of_turn(tok, set())
        self._tokenizer = tok
        return tok

    async def _score_chunk(self, model: str, prompt: list[int], cands: list[list[int]]) -> list[list[float]]:
        body = {**self.extra_body, "model": model, "prompt": [prompt + c for c in cands], "echo": True,
                "logprobs": 1, "max_tokens": 1, "temperature": 0.0}
        try:
            data = await self._request("POST", "/completions", body)
        except _HTTPStatusError as e:
            if e.status in (400, 404, 405, 422, 501):
                raise ScoringUnsupported(f"the server cannot score candidates ({e}); {_USE_GENERATE}") from None
            raise
        choices = data.get("choices")
        if not isinstance(choices, list) or len(choices) != len(cands):
            raise ScoringUnsupported(f"{self.base_url}/completions answered {len(choices) if isinstance(choices, list) else 'no'} "
                                     f"choices for {len(cands)} prompts; {_USE_GENERATE}")
        ordered = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
        out = []
        for cand, choice in zip(cands, ordered, strict=True):
            lp = choice.get("logprobs") if isinstance(choice, dict) else None
            values = lp.get("token_logprobs") if isinstance(lp, dict) else None
            start = len(prompt)
            if not isinstance(values, list) or len(values) < start + len(cand):
                raise ScoringUnsupported(f"{self.base_url}/completions returned no echoed prompt log-probs "
                                         f"(echo + logprobs); {_USE_GENERATE}")
            picked = [_number(v, float) for v in values[start : start + len(cand)]]
            if any(v is None for v in picked):
                raise LLMError(f"{self.base_url}/completions returned malformed log-probs: {str(values)[:200]}")
            out.append(picked)
        return out

    async def list_models(self) -> list[str]:
        """Model names the server offers (``GET /v1/models``)."""
        data = await self._request("GET", "/models", None)
        items = data.get("data")
        return [str(m["id"]) for m in items if isinstance(m, dict) and "id" in m] if isinstance(items, list) else []

    def config(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.model,
            "base_url": self.base_url,
            "api_key_env": self.api_key_env,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
        }

    async def aclose(self) -> None:
        client, self._client = self._client, None
        loop, self._client_loop = self._client_loop, None
        if client is None or loop is None or loop.is_closed():
            return  # connections of a finished event loop are already gone
        if loop is asyncio.get_running_loop():
            await client.aclose()
        else:
            asyncio.run_coroutine_threadsafe(client.aclose(), loop)

    # ----------------------------------------------------------------- helpers
    async def _default_model(self) -> str:
        models = await self.list_models()
        if not models:
            raise LLMError(f"{self.base_url}/models lists no model; pass model=... explicitly")
        self.model = models[0]
        return self.model

    def _client_for_loop(self):
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            key = self.__api_key.value
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            limits = self._httpx.Limits(max_connections=self.max_concurrency)
            self._client = self._httpx.AsyncClient(
                base_url=self.base_url, headers=headers, timeout=self.timeout, limits=limits
            )
            self._client_loop = loop
            self._sem = asyncio.Semaphore(self.max_concurrency)
        return self._client

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        delay = min(self.max_backoff_s, self.backoff_s * 2**attempt) * (0.5 + random.random() / 2)
        wanted = _retry_after_seconds(retry_after)
        if wanted is not None:
            delay = max(delay, min(self.max_backoff_s, wanted))
        return delay

    def _redact(self, text: str) -> str:
        """``text`` with the API key (should a server echo it) replaced by ``***``."""
        key = self.__api_key.value
        return text.replace(key, "***") if key else text

    async def _attempt(self, client, method: str, path: str, body: dict[str, Any] | None):
        """One HTTP exchange, reading at most ``max_response_bytes``: ``(status, headers, bytes)``."""
        async with client.stream(method, path, json=body) as resp:
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_response_bytes:
                raise _TooBig(int(declared))
            chunks, size = [], 0
            async for chunk in resp.aiter_bytes():  # decoded, so a gzip bomb is capped too
                size += len(chunk)
                if size > self.max_response_bytes:
                    raise _TooBig(size)
                chunks.append(chunk)
            return resp.status_code, resp.headers, b"".join(chunks), resp.reason_phrase

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        httpx = self._httpx
        client = self._client_for_loop()
        assert self._sem is not None
        where = f"{method} {self.base_url}{path}"
        last = ""
        for attempt in range(self.max_retries + 1):
            retry_after = None
            try:
                async with self._sem:  # wait_for, not asyncio.timeout: Python 3.10 is supported
                    status, headers, content, reason = await asyncio.wait_for(
                        self._attempt(client, method, path, body), self.timeout
                    )
            except _TooBig as e:
                raise LLMError(
                    f"{where}: the answer is over max_response_bytes={self.max_response_bytes} ({e.size} bytes or "
                    "more); raise max_response_bytes or lower max_tokens"
                ) from None
            except (asyncio.TimeoutError, httpx.TimeoutException):
                last = f"Timeout: no complete answer within {self.timeout:g}s"
            except httpx.TransportError as e:
                last = self._redact(f"{type(e).__name__}: {e or 'connection failed'}")
            else:
                if status < 300:
                    return self._json(where, content)
                last = self._redact(f"HTTP {status}: {_error_message(content, reason)}")
                if not _retryable(status):
                    raise _HTTPStatusError(f"{where} failed with {last}", status)
                retry_after = headers.get("retry-after")
            if attempt < self.max_retries:
                delay = self._delay(attempt, retry_after)
                log.warning("%s: %s; retry %d/%d in %.2fs", where, last, attempt + 1, self.max_retries, delay)
                await asyncio.sleep(delay)
        raise LLMError(f"{where} failed after {self.max_retries + 1} attempts: {last}")

    def _json(self, where: str, content: bytes) -> dict[str, Any]:
        try:
            data = _loads(content)
        except ValueError:
            raise LLMError(
                f"{where} returned invalid JSON: {self._redact(content[:200].decode('utf-8', 'replace'))!r}"
            ) from None
        if not isinstance(data, dict):
            raise LLMError(f"{where} returned JSON that is not an object: {self._redact(str(data)[:200])}")
        return data

    def _parse(self, data: dict[str, Any], model: str) -> Completion:
        choices = data.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise LLMError(
                f"malformed chat completion from {self.base_url} (need choices[0].message): "
                f"{self._redact(str(data)[:200])}"
            )
        content = message.get("content")
        text = content if isinstance(content, str) else _text_parts(content)
        logprobs_obj = choice.get("logprobs")
        lp_items = logprobs_obj.get("content") if isinstance(logprobs_obj, dict) else None
        lp_items = [t for t in lp_items if isinstance(t, dict)] if isinstance(lp_items, list) else []
        logprobs = [_number(t.get("logprob"), float) for t in lp_items]
        if any(lp is None for lp in logprobs):
            logprobs = []  # a malformed entry makes the whole list unusable for training
        token_ids = _int_list(choice.get("token_ids")) or []
        if not token_ids and lp_items and all(str(t.get("token", "")).startswith("token_id:") for t in lp_items):
            token_ids = _int_list([str(t["token"]).split(":", 1)[1] for t in lp_items]) or []
        if token_ids and logprobs and len(token_ids) != len(logprobs):
            logprobs = []  # misaligned (e.g. ids include a stop token the log-probs omit): unusable for training
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        prompt_ids = _int_list(data.get("prompt_token_ids")) or _int_list(choice.get("prompt_token_ids"))
        prompt_tokens = _number(usage.get("prompt_tokens"), int)
        return Completion(
            text=text,
            token_ids=token_ids,
            logprobs=logprobs,  # type: ignore[arg-type]
            prompt_token_ids=prompt_ids or None,
            prompt_tokens=prompt_tokens if prompt_tokens is not None else len(prompt_ids or []),
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            model=str(data.get("model") or model),
            reported_completion_tokens=_number(usage.get("completion_tokens"), int),
        )


class _Secret:
    """Holds the API key so that ``vars(llm)`` and ``repr`` of the backend show ``***``."""

    __slots__ = ("value",)

    def __init__(self, value: str):
        self.value = value

    def __repr__(self) -> str:
        return "***"


class _TooBig(Exception):
    def __init__(self, size: int):
        super().__init__(size)
        self.size = size


def _loads(content: bytes) -> Any:
    try:
        return json.loads(content)
    except RecursionError as e:
        raise ValueError("JSON nested too deeply") from e


def _number(value: Any, kind: type) -> Any:
    """``value`` as a finite ``kind`` (``int`` must be >= 0), or ``None`` when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if kind is int:
        return int(value) if value >= 0 and value == int(value) else None
    return float(value)


def _int_list(value: Any) -> list[int] | None:
    """A list of token ids, or ``None`` when ``value`` is not one."""
    if not isinstance(value, list):
        return None
    try:
        out = [int(v) for v in value if not isinstance(v, bool)]
    except (TypeError, ValueError):
        return None
    return out if len(out) == len(value) and all(v >= 0 for v in out) else None


def _text_parts(content: Any) -> str:
    """The text of ``content`` given as a list of ``{"type": "text", "text": ...}`` parts; ``""`` otherwise."""
    if not isinstance(content, list):
        return ""
    return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))


def _response_format(schema_text: str) -> dict[str, Any]:
    schema = json.loads(schema_text)
    name = schema.get("title") if isinstance(schema.get("title"), str) else "reply"
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)[:64] or "reply"
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _refuses_response_format(error: _HTTPStatusError) -> bool:
    """A 400/422 whose message is about ``response_format`` (unsupported here, or this schema refused)."""
    text = str(error).lower()
    return error.status in (400, 422) and any(k in text for k in ("response_format", "json_schema", "response format"))


def _retry_after_seconds(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (a number or an HTTP date), or ``None``."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _error_message(content: bytes, reason: str) -> str:
    try:
        err = _loads(content).get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        if err:
            return str(err)[:300]
    except (ValueError, AttributeError):
        pass
    return content[:300].decode("utf-8", "replace") or reason
