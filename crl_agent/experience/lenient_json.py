"""Lenient JSON for small or thinking models: find it in fenced blocks, prose or after ``<think>``.

:func:`extract_json` tries, in order: each fenced code block, the whole text, then every bracketed
span; each candidate is parsed as JSON, then with trailing commas and smart quotes repaired, then
as a Python literal (single quotes, ``True``/``None``).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)


def strip_thinking(text: str) -> str:
    """Drop ``<think>...</think>`` sections (and anything before a lone ``</think>``)."""
    text = _THINK.sub("", text)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text.strip()


def _loads(s: str) -> Any:
    s = s.strip()
    for attempt in range(3):
        try:
            if attempt == 0:
                return json.loads(s)
            if attempt == 1:
                fixed = re.sub(r",\s*([}\]])", r"\1", s.translate(str.maketrans("“”‘’", "\"\"''")))
                return json.loads(fixed)
            return ast.literal_eval(s)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
    raise ValueError("not JSON")


def _balanced(text: str, start: int) -> str | None:
    """The bracketed span starting at ``text[start]``, respecting strings."""
    opener = text[start]
    closer = "}" if opener == "{" else "]"
    depth, in_str, esc, quote = 0, False, False, ""
    for i in range(start, len(text)):
        c = text[i]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == quote:
                in_str = False
        elif c in "\"'":
            in_str, quote = True, c
        elif c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def extract_json(text: str) -> Any:
    """The first JSON value found in ``text`` (fenced block, whole text or a bracketed span).

    Raises:
        ValueError: no parseable JSON object or array in the text.
    """
    text = strip_thinking(text)
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for c in candidates:
        try:
            return _loads(c)
        except ValueError:
            pass
    for i, ch in enumerate(text):
        if ch in "{[":
            span = _balanced(text, i)
            if span is not None:
                try:
                    value = _loads(span)
                except ValueError:
                    continue
                if isinstance(value, dict | list):
                    return value
    raise ValueError("no JSON object found")
