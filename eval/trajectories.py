"""Trajectories on disk: every episode of a run, step by step (schema ``crl-bench/trajectory`` 1.0).

A run folder holds ``trajectories.jsonl.gz`` beside ``episodes.jsonl``: gzip, one JSON object per
line, one line per finished episode. Each episode is appended as its own gzip member, so a kill
mid-write leaves at most one torn member at the end; :func:`load_trajectories` skips it with a
warning and ``eval.run --resume`` rewrites the file without it.

One record (``--trajectories text``, the default; ``full`` adds the fields marked *full*)::

    {"schema": "crl-bench/trajectory", "schema_version": "1.0", "mode": "text" | "full",
     "key": "env_id#seed#sample", "env_id": str, "seed": int, "sample": int,
     "agent": str,                  # the agent's name
     "task": str,                   # info["task"] at reset
     "summary": {...},              # the episode's episodes.jsonl fields (success, progress, reward,
                                    # actions, invalid_actions, terminated, truncated, wall_time_s,
                                    # error, tokens_in, tokens_out, extra)
     "steps": [{"t": int,           # 0-based
                "observation": str, # what the policy acted on
                "admissible_actions": [str] | null,
                "action": str, "reward": float, "valid_action": bool,
                "terminated": bool, "truncated": bool, "success": bool, "progress": float,
                "info": {...},      # the step's other info keys, JSON-safe
                "turn": null | {    # the policy's trace of that action (LLM agents):
                    "messages": [{"role", "content"}],  # as sent, after history truncation
                    "reply": str, "method": str, "policy_version": int,
                    "candidates": [{"text", "logprob", "prob"}], "chosen": int,   # score mode
                    "experience_shown": [{"id", "title", "content"}], "searches": [{"question", "answer"}],
                    "tool_choices": [{"candidates", "chosen", ...}],   # score mode: decisions that chose a tool
                    "prompt_token_ids", "token_ids", "logprobs", "candidate_token_ids",   # full only
                    "calls": [...]}}],                   # full only: each model call of the turn
     "final_observation": str}

**Text mode** keeps what a person reads: it drops the *full* fields and caps every string at
:data:`TEXT_CAP` characters (longer ones keep the first and last half with
``[... N characters omitted ...]`` between). **Full mode** keeps everything as recorded. ``none``
writes no file. Runs recorded before schema 1.2 of ``summary.json`` have no trajectories file.

Records are standard JSON (encoded with orjson): a non-finite number (NaN, infinity) is written as
``null``.
"""

from __future__ import annotations

import json
import os
import warnings
import zlib
from pathlib import Path
from typing import Any

from crl_agent.trajectory import (  # noqa: F401 - the writing half, shared with the trainer; re-exported
    FILENAME,
    FULL_ONLY_TURN_FIELDS,
    MODES,
    SCHEMA,
    SCHEMA_VERSION,
    TEXT_CAP,
    cap_text,
    encode_line,
    encode_member,
    make_record,
)

_CHUNK = 1 << 16  # bytes fed to the decompressor at a time when reading members

_TOP_FIELDS = {"schema": str, "schema_version": str, "mode": str, "key": str, "env_id": str, "seed": int,
               "sample": int, "agent": str, "task": str, "summary": dict, "steps": list, "final_observation": str}
_STEP_FIELDS = {"t": int, "observation": str, "action": str, "reward": (int, float), "valid_action": bool,
                "terminated": bool, "truncated": bool, "success": bool, "progress": (int, float), "info": dict}


class TrajectoryError(ValueError):
    """A trajectory record does not follow the schema."""


def validate_record(record: Any) -> None:
    """Raise :class:`TrajectoryError` naming the first field that breaks the schema."""
    if not isinstance(record, dict):
        raise TrajectoryError(f"a trajectory record is a JSON object, got {type(record).__name__}")
    for name, typ in _TOP_FIELDS.items():
        if name not in record:
            raise TrajectoryError(f"trajectory record lacks {name!r}")
        if not isinstance(record[name], typ) or (typ is int and isinstance(record[name], bool)):
            raise TrajectoryError(f"trajectory {record.get('key')}: {name} must be {typ.__name__}")
    if record["schema"] != SCHEMA or record["schema_version"].split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise TrajectoryError(f"trajectory {record['key']}: schema {record['schema']} {record['schema_version']} "
                              f"is not {SCHEMA} {SCHEMA_VERSION}")
    if record["mode"] not in ("text", "full"):
        raise TrajectoryError(f"trajectory {record['key']}: mode must be 'text' or 'full'")
    for i, step in enumerate(record["steps"]):
        if not isinstance(step, dict):
            raise TrajectoryError(f"trajectory {record['key']}: steps[{i}] must be an object")
        for name, typ in _STEP_FIELDS.items():
            if not isinstance(step.get(name), typ):
                raise TrajectoryError(f"trajectory {record['key']}: steps[{i}].{name} is missing or not "
                                      f"{getattr(typ, '__name__', 'a number')}")
        if step.get("turn") is not None and not isinstance(step["turn"], dict):
            raise TrajectoryError(f"trajectory {record['key']}: steps[{i}].turn must be an object or null")
        if step.get("admissible_actions") is not None and not isinstance(step["admissible_actions"], list):
            raise TrajectoryError(f"trajectory {record['key']}: steps[{i}].admissible_actions must be a list or null")


def _read_members(path: Path) -> tuple[list[dict[str, Any]], int, bool]:
    """Records, the byte offset where the last complete member ends, and whether anything was torn."""
    data = path.read_bytes()
    view = memoryview(data)
    records: list[dict[str, Any]] = []
    pos, good_end, torn = 0, 0, False
    while pos < len(data):
        d = zlib.decompressobj(wbits=31)  # one gzip member
        # fed in chunks, so that reading n members copies O(n) bytes, not the whole rest of the file each
        parts, fed = [], pos
        try:
            while not d.eof and fed < len(data):
                chunk = view[fed:fed + _CHUNK]
                fed += len(chunk)
                parts.append(d.decompress(chunk))
            parts.append(d.flush())
        except zlib.error:
            torn = True
            break
        if not d.eof:
            torn = True
            break
        text = b"".join(parts)
        pos = fed - len(d.unused_data)
        for line in text.decode("utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                torn = True
        good_end = pos
    return records, good_end, torn


def load_trajectories(run_dir: str | Path, *, validate: bool = False) -> list[dict[str, Any]]:
    """Every episode's trajectory in a run folder, newest record per key, in file order.

    A torn or corrupt tail (a killed run) is skipped with a warning. A run folder without a
    trajectories file (older runs, ``--trajectories none``) gives an empty list.

    Args:
        run_dir: the run folder (or the ``trajectories.jsonl.gz`` file itself).
        validate: check every record against the schema (raises :class:`TrajectoryError`).
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / FILENAME
    if not path.exists():
        return []
    records, _, torn = _read_members(path)
    if torn:
        warnings.warn(f"{path}: skipped a torn or corrupt record at the end (a killed run); "
                      "`python -m eval.run ... --resume` repairs the file", stacklevel=2)
    latest: dict[str, dict[str, Any]] = {}
    for r in records:
        if validate:
            validate_record(r)
        if isinstance(r, dict) and "key" in r:
            latest.pop(r["key"], None)
            latest[r["key"]] = r
    return list(latest.values())


def repair(run_dir: Path, keep: dict[str, dict[str, Any]]) -> None:
    """Make the trajectories file agree with ``episodes.jsonl`` after a kill.

    Keeps, for each key in ``keep`` (the latest ``episodes.jsonl`` record per key), the newest
    trajectory whose summary matches that record; drops torn members and trajectories of episodes
    that were never recorded (killed between the two writes). Rewrites atomically.
    """
    path = run_dir / FILENAME
    if not path.exists():
        return
    records, good_end, torn = _read_members(path)
    chosen: dict[str, dict[str, Any]] = {}
    for r in records:
        want = keep.get(r.get("key")) if isinstance(r, dict) else None
        if want is not None and r.get("summary", {}).get("error") == want.get("error") and \
                r.get("summary", {}).get("success") == want.get("success"):
            chosen[r["key"]] = r
    if not torn and len(chosen) == len(records):
        return
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        for r in chosen.values():
            f.write(encode_member(r))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
