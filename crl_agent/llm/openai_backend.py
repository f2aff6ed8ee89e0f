"""``openai`` backend: any OpenAI-compatible chat-completions server.

Works with ``vllm serve``, SGLang, the llama.cpp server, hosted APIs and our own
``python -m crl_agent.serve``. Requests go through ``httpx`` with a per-request timeout and
retries with exponential backoff (plus jitter, honouring ``Retry-After``) on connection errors,
timeouts, 408/409/429 and 5xx answers. Other 4xx answers fail at once with the server's message.

The API key is read from the environment (``OPENAI_API_KEY`` by default, or the variable named
by ``api_key_env``) when the backend is built; it is sent as a bearer token and never logged,
never put in :meth:`OpenAILLM.config` or ``repr``.

Log-probs are requested (``logprobs: true``) and parsed from ``choices[0].logprobs.content``
when the server returns them. Token ids come back only from servers that return them
(``choices[0].token_ids``, as vLLM does with ``return_token_ids``; ``"token_id:N"`` token
strings, as vLLM does with ``return_tokens_as_token_ids``); elsewhere ``token_ids`` is empty
and ``Completion.completion_tokens`` falls back to the server's ``usage``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import Any

from crl_agent.llm.base import LLM, Completion, LLMError, Message, SamplingParams

log = logging.getLogger(__name__)
_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


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
        timeout: seconds per HTTP request.
        max_retries: retries after the first attempt.
        backoff_s: first retry delay; doubles each retry, capped at ``max_backoff_s``.
        max_backoff_s: cap on one retry delay.
        max_concurrency: most requests in flight at once.
        logprobs: request token log-probs (turn off for servers that reject the field).
        return_token_ids: ask for token ids (vLLM's ``return_token_ids``; our server honours it).
        extra_body: extra JSON fields sent with every request (e.g. ``{"top_k": 20}``).
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
    ):
        self._httpx = _import_httpx()
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.__api_key = os.environ.get(api_key_env) or None
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.max_concurrency = int(max_concurrency)
        self.logprobs = logprobs
        self.return_token_ids = return_token_ids
        self.extra_body = dict(extra_body or {})
        self._client = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return f"OpenAILLM(model={self.model!r}, base_url={self.base_url!r}, api_key_env={self.api_key_env!r})"

    # ------------------------------------------------------------------ public
    async def chat(self, messages: list[Message], params: SamplingParams | None = None) -> Completion:
        params = params or SamplingParams()
        model = self.model or await self._default_model()
        body: dict[str, Any] = {
            **self.extra_body,
            "model": model,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        if self.logprobs:
            body["logprobs"] = True
        if self.return_token_ids:
            body["return_token_ids"] = True
        data = await self._request("POST", "/chat/completions", body)
        return self._parse(data, model)

    async def list_models(self) -> list[str]:
        """Model names the server offers (``GET /v1/models``)."""
        data = await self._request("GET", "/models", None)
        return [m["id"] for m in data.get("data", []) if isinstance(m, dict) and "id" in m]

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
            headers = {"Authorization": f"Bearer {self.__api_key}"} if self.__api_key else {}
            limits = self._httpx.Limits(max_connections=self.max_concurrency)
            self._client = self._httpx.AsyncClient(
                base_url=self.base_url, headers=headers, timeout=self.timeout, limits=limits
            )
            self._client_loop = loop
            self._sem = asyncio.Semaphore(self.max_concurrency)
        return self._client

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        delay = min(self.max_backoff_s, self.backoff_s * 2**attempt) * (0.5 + random.random() / 2)
        if retry_after:
            try:
                delay = max(delay, min(self.max_backoff_s, float(retry_after)))
            except ValueError:
                pass
        return delay

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        httpx = self._httpx
        client = self._client_for_loop()
        assert self._sem is not None
        last = ""
        for attempt in range(self.max_retries + 1):
            retry_after = None
            try:
                async with self._sem:
                    resp = await client.request(method, path, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                last = f"{type(e).__name__} after {self.timeout:g}s timeout" if isinstance(
                    e, httpx.TimeoutException) else f"{type(e).__name__}: {e}"
            else:
                if resp.status_code < 300:
                    try:
                        return resp.json()
                    except ValueError as e:
                        raise LLMError(f"{self.base_url}{path} returned invalid JSON: {resp.text[:200]!r}") from e
                last = f"HTTP {resp.status_code}: {_error_message(resp)}"
                if resp.status_code not in _RETRY_STATUS:
                    raise LLMError(f"{method} {self.base_url}{path} failed with {last}")
                retry_after = resp.headers.get("retry-after")
            if attempt < self.max_retries:
                delay = self._delay(attempt, retry_after)
                log.warning("%s %s%s: %s; retry %d/%d in %.2fs", method, self.base_url, path, last, attempt + 1,
                            self.max_retries, delay)
                await asyncio.sleep(delay)
        raise LLMError(f"{method} {self.base_url}{path} failed after {self.max_retries + 1} attempts: {last}")

    def _parse(self, data: dict[str, Any], model: str) -> Completion:
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            raise LLMError(f"malformed chat completion from {self.base_url}: {str(data)[:200]}") from e
        lp_items = ((choice.get("logprobs") or {}).get("content")) or []
        logprobs = [float(t.get("logprob", 0.0)) for t in lp_items]
        token_ids = [int(t) for t in choice.get("token_ids") or []]
        if not token_ids and lp_items and all(str(t.get("token", "")).startswith("token_id:") for t in lp_items):
            token_ids = [int(str(t["token"]).split(":", 1)[1]) for t in lp_items]
        if token_ids and logprobs and len(token_ids) != len(logprobs):
            logprobs = []  # misaligned (e.g. ids include a stop token the log-probs omit): unusable for training
        usage = data.get("usage") or {}
        prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
        return Completion(
            text=text,
            token_ids=token_ids,
            logprobs=logprobs,
            prompt_token_ids=[int(t) for t in prompt_ids] if prompt_ids else None,
            prompt_tokens=int(usage.get("prompt_tokens") or (len(prompt_ids) if prompt_ids else 0)),
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            model=str(data.get("model") or model),
            reported_completion_tokens=usage.get("completion_tokens"),
        )


def _error_message(resp) -> str:
    try:
        err = resp.json().get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        if err:
            return str(err)[:300]
    except (ValueError, AttributeError):
        pass
    return resp.text[:300] or resp.reason_phrase
