"""Validation of leaderboard submissions: a run's ``summary.json`` plus ``metadata.yaml``.

Errors name the file and the field, e.g.
``leaderboards/submissions/x/summary.json: tasks.crl/Sokoban-6x6-2-v0.success: missing``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

SUPPORTED_SCHEMAS = ("1.0", "1.1", "1.2", "1.3")
METADATA_FIELDS = {"name": str, "model": str, "agent": str, "date": str, "url": str, "verified": bool}
TASK_FIELDS = {"episodes": int, "success": float, "success_se": float, "progress": float, "mean_actions": float,
               "errored": int, "version": int}


class SubmissionError(ValueError):
    """A submission file is missing a field or has a bad value."""


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_fields(path: Path, where: str, obj: Any, fields: dict[str, type]) -> None:
    if not isinstance(obj, dict):
        raise SubmissionError(f"{path}: {where or 'top level'}: expected a mapping")
    for name, kind in fields.items():
        key = f"{where}.{name}" if where else name
        if name not in obj:
            raise SubmissionError(f"{path}: {key}: missing")
        ok = _num(obj[name]) if kind is float else (
            isinstance(obj[name], kind) and not (kind is int and isinstance(obj[name], bool))
        )
        if not ok:
            raise SubmissionError(f"{path}: {key}: expected {kind.__name__}, got {obj[name]!r}")


def load_submission(folder: Path) -> dict[str, Any]:
    """Load and validate one submission folder; return ``{"summary", "metadata", "folder"}``."""
    summary_path, meta_path = folder / "summary.json", folder / "metadata.yaml"
    for p in (summary_path, meta_path):
        if not p.exists():
            raise SubmissionError(f"{p}: missing file")
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SubmissionError(f"{summary_path}: not valid JSON: {e}") from e
    try:
        meta = yaml.safe_load(meta_path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise SubmissionError(f"{meta_path}: not valid YAML: {e}") from e
    if isinstance(meta, dict) and not isinstance(meta.get("date"), str) and meta.get("date") is not None:
        meta["date"] = str(meta["date"])  # YAML parses 2026-12-02 as a date
    _check_fields(meta_path, "", meta, METADATA_FIELDS)
    if meta["url"] and not meta["url"].lower().startswith(("https://", "http://")):
        # The Markdown and the site make it a link: only web addresses, never javascript: or data: URLs.
        raise SubmissionError(f"{meta_path}: url: {meta['url']!r} is not an http(s) address; use one or ''")
    if not isinstance(summary, dict):
        raise SubmissionError(f"{summary_path}: top level: expected an object")
    version = summary.get("schema_version")
    if version not in SUPPORTED_SCHEMAS:
        raise SubmissionError(f"{summary_path}: schema_version: {version!r} is not one of {SUPPORTED_SCHEMAS}")
    for key in ("package_version", "agent", "run", "tasks", "macro"):
        if key not in summary:
            raise SubmissionError(f"{summary_path}: {key}: missing")
    if not isinstance(summary["tasks"], dict) or not summary["tasks"]:
        raise SubmissionError(f"{summary_path}: tasks: expected a non-empty object")
    for env_id, task in summary["tasks"].items():
        if isinstance(task, dict) and "version" in task and task["version"] is None:
            raise SubmissionError(
                f"{summary_path}: tasks.{env_id}.version: the id has no version; register the env as "
                f"'{env_id}-v0' (bump vN when it changes) and rerun, so results stay comparable"
            )
        _check_fields(summary_path, f"tasks.{env_id}", task, TASK_FIELDS)
        for f in ("success", "progress"):
            if not 0.0 <= task[f] <= 1.0:
                raise SubmissionError(f"{summary_path}: tasks.{env_id}.{f}: {task[f]} is outside [0, 1]")
        if task["episodes"] < 1:
            raise SubmissionError(f"{summary_path}: tasks.{env_id}.episodes: must be at least 1")
    _check_fields(summary_path, "macro", summary["macro"], {"success": float, "success_se": float})
    if "stream" in summary:
        _check_stream(summary_path, summary)
    return {"summary": summary, "metadata": meta, "folder": folder}


STREAM_TASK_FIELDS = {"worlds": int, "experience_gain": float, "experience_gain_se": float,
                      "tail_success_memory": float, "tail_success_no_memory": float}


def _check_stream(path: Path, summary: dict[str, Any]) -> None:
    """An experience-track run (``eval.run --stream``): its gains, on held-out worlds."""
    from crl_envs.persistent import HELD_OUT_FIRST_WORLD

    stream = summary["stream"]
    _check_fields(path, "stream", stream, {"stream": int, "tail": int, "tasks": dict, "macro": dict})
    _check_fields(path, "stream.macro", stream["macro"], {"experience_gain": float, "experience_gain_se": float})
    for env_id, task in stream["tasks"].items():
        _check_fields(path, f"stream.tasks.{env_id}", task, STREAM_TASK_FIELDS)
    seed = summary["run"].get("seed")
    if not isinstance(seed, int) or seed < HELD_OUT_FIRST_WORLD:
        raise SubmissionError(f"{path}: run.seed: the experience track plays held-out worlds: rerun with "
                              f"--seed {HELD_OUT_FIRST_WORLD} (or higher), got {seed!r}")
