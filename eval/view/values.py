"""Untrusted run data made safe for strict JSON: numbers, text and whole values (the viewer's data files)."""

from __future__ import annotations

import json
import math
from typing import Any


def num(x: Any) -> float | int | None:
    """A JSON-safe number: ``None`` for NaN, infinities and non-numbers (booleans count as 0/1)."""
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    return None


def text(x: Any) -> str:
    """Untrusted content as a string (a record from a foreign run may hold a number or null)."""
    return x if isinstance(x, str) else "" if x is None else json.dumps(x, default=str)


def jsonable(x: Any) -> Any:
    """A deep copy of ``x`` that strict JSON can hold (non-finite floats become ``None``)."""
    if isinstance(x, float):
        return num(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if x is None or isinstance(x, (str, int, bool)):
        return x
    return str(x)
