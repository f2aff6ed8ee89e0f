"""What both endpoints of :mod:`crl_agent.serve` share: the HTTP error a bad request becomes, and the
validation of a request's sampling fields (``/v1/chat/completions`` and :mod:`crl_agent.serve_completions`)."""

from __future__ import annotations

import math
from typing import Any

from crl_agent.llm import SamplingParams

MAX_STOP_STRINGS = 16


class HTTPError(Exception):
    """A request the server answers with ``status`` and OpenAI's error shape (``message``, ``kind`` as its type)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _field(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    """``body[name]`` as ``kind`` (JSON ``null`` or absent: ``default``); raise :class:`HTTPError` otherwise."""
    value = body.get(name)
    if value is None:
        return default
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        what = "an integer" if kind is int else "a finite number"
        raise HTTPError(400, f"bad sampling parameter: {name} must be {what}, got {value!r}")
    return kind(value)


def sampling_params_from_request(body: dict[str, Any]) -> SamplingParams:
    """Validate an OpenAI chat request's sampling fields; raise :class:`HTTPError` (400) on bad ones."""
    if body.get("stream"):
        raise HTTPError(400, "stream=true is not supported by this server")
    if body.get("n") not in (None, 1) or isinstance(body.get("n"), bool):
        raise HTTPError(400, f"only n=1 is supported, got n={body.get('n')!r}")
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not (isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop)):
        raise HTTPError(400, "stop must be a string or a list of strings")
    if len(stop) > MAX_STOP_STRINGS:
        raise HTTPError(400, f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _field(body, name, int, 256)
    temperature = _field(body, "temperature", float, 1.0)
    top_p = _field(body, "top_p", float, 1.0)
    seed = _field(body, "seed", int, None)
    if max_tokens < 1:
        raise HTTPError(400, f"{name} must be at least 1, got {max_tokens}")
    if temperature < 0:
        raise HTTPError(400, f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise HTTPError(400, f"top_p must be in (0, 1], got {top_p}")
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=tuple(stop), seed=seed)
