"""An experience-track run (``eval.run --stream``) for the viewer: each episode's place in its world's stream and
what it read from memory and wrote to it.

A stream run's episodes carry ``world``, ``stream_index`` and ``memory`` in ``episodes.jsonl``
(:mod:`eval.stream`). What an episode *read* comes from its turn traces: ``memory_read`` (the ``notebook``,
``oracle-memory`` and ``reflexion`` agents), ``experience_shown`` and ``searches`` (the ``crl`` agent). What it
*wrote* comes from its ``extra``: ``memory_write`` (the entries themselves: ``notebook``, ``oracle-memory``),
else the counts agents report (``memory_written``, ``reflection_queued``, ``bank_entries``). The site writes
these as ``data/<run>/stream.js`` (:mod:`eval.view.site`), loaded by the stream page and by compare.
"""

from __future__ import annotations

import json
from typing import Any

from eval.view.values import jsonable, num, text

CAP = 2000  # characters kept of one read or written item (a bank entry's content can be long)

# Counts an agent reports in ``extra`` about its writes, shown where it records no entries, in words.
_WRITE_COUNTS = {
    "memory_written": "{} entries written",
    "reflection_queued": "{} reflection queued (written after the episode; the world's next episodes read it)",
    "bank_entries": "the bank holds {} entries after the episode",
}


def _cap(s: str) -> str:
    return s if len(s) <= CAP else s[:CAP] + f" […{len(s) - CAP} characters omitted]"


def _items(value: Any) -> list[str]:
    """A memory value as lines: a mapping one ``key: value`` a line, a list one item a line."""
    if isinstance(value, dict):  # one level of nesting flattened: locations.mug: drawer 1
        flat: list[tuple[str, Any]] = []
        for k, v in value.items():
            flat += [(f"{k}.{k2}", v2) for k2, v2 in v.items()] if isinstance(v, dict) else [(str(k), v)]
        return [_cap(f"{k}: {v if isinstance(v, str) else json.dumps(jsonable(v))}") for k, v in flat]
    if isinstance(value, list):
        return [_cap(v if isinstance(v, str) else json.dumps(jsonable(v))) for v in value]
    return [] if value is None or value == "" else [_cap(text(value))]


def memory_read(traj: dict[str, Any] | None) -> list[str]:
    """What an episode read from memory, over all its turns, each item once, in the order first read."""
    out: dict[str, None] = {}
    for s in (traj or {}).get("steps") or []:
        turn = s.get("turn") if isinstance(s, dict) and isinstance(s.get("turn"), dict) else {}
        for item in _items(turn.get("memory_read")):
            out.setdefault(item)
        for e in turn.get("experience_shown") or []:
            if isinstance(e, dict):
                out.setdefault(_cap(f"experience: {text(e.get('title'))}: {text(e.get('content'))}"))
        for q in turn.get("searches") or []:
            if isinstance(q, dict):
                out.setdefault(_cap(f"search: {text(q.get('question'))} → {text(q.get('answer'))}"))
    return list(out)


def memory_written(record: dict[str, Any]) -> list[str]:
    """What an episode wrote to memory: the entries where the agent records them, else its counts in words."""
    extra = record.get("extra") if isinstance(record.get("extra"), dict) else {}
    if extra.get("memory_write"):
        return _items(extra["memory_write"])
    return [f.format(num(extra[k])) for k, f in _WRITE_COUNTS.items() if num(extra.get(k)) is not None]


def is_stream_run(summary: dict[str, Any] | None) -> bool:
    return isinstance(summary, dict) and isinstance(summary.get("stream"), dict)


def stream_entry(row: int, record: dict[str, Any], traj: dict[str, Any] | None) -> dict[str, Any] | None:
    """One episode's place in its stream and its memory traffic; ``None`` for a record with no stream place."""
    world, j = num(record.get("world")), num(record.get("stream_index"))
    if world is None or j is None:
        return None
    return {"row": row, "world": world, "j": j, "memory": bool(record.get("memory", True)),
            "read": memory_read(traj), "wrote": memory_written(record)}
