"""Lenient JSON for small or thinking models: find it in fenced blocks, prose or after ``<think>``.

:func:`extract_json` tries, in order: each fenced code block, the whole text, then every bracketed
span; each candidate is parsed as JSON, then with trailing commas and smart quotes repaired, then
as a Python literal (single quotes, ``True``/``None``).

Work is bounded for hostile or runaway replies: plain JSON parsing (C speed) reads the whole
text, the slower repairs only candidates up to ``MAX_REPAIR_CHARS``, and the bracket scan at most
``MAX_SCAN_STEPS`` characters in all, so no reply (megabytes long, ``{`` repeated, deeply nested)
takes more than a fraction of a second.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

MAX_REPAIR_CHARS = 100_000
MAX_SCAN_STEPS = 2_000_000
MAX_SPANS = 200
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)


def strip_thinking(text: str) -> str:
    """Drop ``<think>...</think>`` sections (and anything before a lone ``</think>``)."""
    low, kept, pos = text.lower(), [], 0
    while (start := low.find("<think>", pos)) >= 0:  # linear: a regex would rescan for every unclosed tag
        end = low.find("</think>", start + 7)
        if end < 0:
            break
        kept.append(text[pos:start])
        pos = end + 8
    kept.append(text[pos:])
    text = "".join(kept)
    cut = text.lower().rfind("</think>")
    if cut >= 0:
        text = text[cut + 8 :]
    return text.strip()


def _loads(s: str) -> Any:
    s = s.strip()
    for attempt in range(3 if len(s) <= MAX_REPAIR_CHARS else 1):
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


def _balanced(text: str, start: int, budget: list[int]) -> str | None:
    """The bracketed span starting at ``text[start]``, respecting strings; scanning spends ``budget[0]``."""
    opener = text[start]
    closer = "}" if opener == "{" else "]"
    depth, in_str, esc, quote = 0, False, False, ""
    stop = min(len(text), start + max(budget[0], 0))
    budget[0] -= stop - start
    for i in range(start, stop):
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
    budget, spans = [MAX_SCAN_STEPS], 0
    for i, ch in enumerate(text):
        if budget[0] <= 0 or spans >= MAX_SPANS:
            raise ValueError("no JSON object found (gave up scanning a reply full of unbalanced brackets)")
        if ch in "{[":
            span = _balanced(text, i, budget)
            spans += span is not None
            if span is not None:
                try:
                    value = _loads(span)
                except ValueError:
                    continue
                if isinstance(value, dict | list):
                    return value
    raise ValueError("no JSON object found")
