"""Turn run folders into the viewer's data: a slim summary, an episode index, step chunks, search text.

Everything here is plain JSON-able data; :mod:`eval.view.site` writes it as ``<script>`` data files.
Untrusted text (observations, actions, model replies) passes through unchanged: the page renders it as
text, never as HTML. Numbers that JSON cannot hold (NaN, infinities) become ``null``.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.report import agent_label, load_run_checked
from eval.results import EpisodeLog, record_key
from eval.trajectories import FILENAME as TRAJECTORIES
from eval.trajectories import FULL_ONLY_TURN_FIELDS, load_trajectories
from eval.view.incomplete import has_episodes_on_disk, tally_summary
from eval.view.stream import is_stream_run, stream_entry
from eval.view.values import jsonable, num, text  # noqa: F401 - re-exported: callers import them from here

# Step fields the page shows in their own columns; the rest of a step's info is listed under "info".
_SHOWN_INFO = {"admissible_actions", "valid_action", "success", "progress", "task"}


def slug(name: str) -> str:
    """A file-name-safe id for a run (lowercase letters, digits, ``-``)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "run"


def _turn(turn: Any) -> dict[str, Any] | None:
    if not isinstance(turn, dict):
        return None
    out = {k: jsonable(v) for k, v in turn.items() if k not in FULL_ONLY_TURN_FIELDS}
    for k in ("prompt_token_ids", "token_ids"):
        if isinstance(turn.get(k), list):
            out[f"n_{k}"] = len(turn[k])
    return out


def _step_row(step: dict[str, Any], adm_table: dict[str, int]) -> list[Any]:
    """One step as a compact row (field order in ``STEP_FIELDS``), admissible lists interned per episode."""
    adm = step.get("admissible_actions")
    adm_idx = None
    if isinstance(adm, list):
        adm_idx = adm_table.setdefault(json.dumps([text(a) for a in adm]), len(adm_table))
    info = step.get("info") if isinstance(step.get("info"), dict) else {}
    return [
        text(step.get("observation")), text(step.get("action")), num(step.get("reward")),
        bool(step.get("valid_action", True)), num(step.get("progress")), bool(step.get("terminated")),
        bool(step.get("truncated")), bool(step.get("success")), adm_idx,
        jsonable({k: v for k, v in info.items() if k not in _SHOWN_INFO}) or None, _turn(step.get("turn")),
    ]


STEP_FIELDS = ["observation", "action", "reward", "valid", "progress", "terminated", "truncated", "success",
               "adm", "info", "turn"]


def episode_payload(traj: dict[str, Any]) -> dict[str, Any]:
    """What the episode page needs of one trajectory record."""
    adm_table: dict[str, int] = {}
    steps = [_step_row(s, adm_table) for s in traj.get("steps") or [] if isinstance(s, dict)]
    return {
        "task": text(traj.get("task")),
        "mode": text(traj.get("mode")),
        "agent": text(traj.get("agent")),
        "final": text(traj.get("final_observation")),
        "adm": [json.loads(k) for k in adm_table],
        "steps": steps,
    }


def search_text(traj: dict[str, Any] | None, record: dict[str, Any]) -> str:
    """Every line a person might search for in one episode, lowercased and deduplicated.

    Lines repeat heavily (a board's walls, the history in each prompt), so keeping each distinct line once
    makes the index a fraction of the trajectories while still finding any text within a line.
    """
    parts: list[str] = [text(record.get("error"))]
    if traj:
        parts += [text(traj.get("task")), text(traj.get("final_observation"))]
        for s in traj.get("steps") or []:
            if not isinstance(s, dict):
                continue
            parts += [text(s.get("observation")), text(s.get("action"))]
            turn = s.get("turn") if isinstance(s.get("turn"), dict) else {}
            parts.append(text(turn.get("reply")))
            for key, fields in (("messages", ("content",)), ("candidates", ("text",)),
                                ("experience_shown", ("title", "content")), ("searches", ("question", "answer"))):
                for item in turn.get(key) or []:
                    if isinstance(item, dict):
                        parts += [text(item.get(f)) for f in fields]
    lines = dict.fromkeys(line.strip() for p in parts for line in p.lower().splitlines())
    lines.pop("", None)
    return "\n".join(lines)


def action_list(traj: dict[str, Any] | None) -> list[str] | None:
    if not traj:
        return None
    return [text(s.get("action")) for s in traj.get("steps") or [] if isinstance(s, dict)]


def slim_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary fields the run page shows (agent and run config are kept whole: they are small)."""
    keep = ("schema_version", "package_version", "git_sha", "created", "python", "agent", "run", "tasks", "macro",
            "errors", "incomplete", "train_eval", "stream")
    return jsonable({k: summary.get(k) for k in keep if k in summary})


@dataclass
class RunData:
    """One run ready for the page: rows of the episode index plus per-episode payloads (by row)."""

    id: str
    label: str
    folder: str
    summary: dict[str, Any]
    tasks: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    payloads: list[dict[str, Any] | None] = field(default_factory=list)
    search: list[str] = field(default_factory=list)
    actions: list[list[str] | None] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    stream: list[dict[str, Any]] = field(default_factory=list)  # a stream run's episodes (eval.view.stream)


# Columns of one episode-index row, in order.
INDEX_FIELDS = ["task", "seed", "sample", "success", "progress", "reward", "actions", "invalid", "error",
                "tokens_in", "tokens_out", "wall_time_s", "has_steps"]


def _sample(r: dict[str, Any]) -> int:
    s = r.get("sample", 0)
    return s if isinstance(s, int) and not isinstance(s, bool) else 0


def _seed(r: dict[str, Any]) -> int | str:
    """The seed as a key part: an int, or the text of whatever a foreign record holds (a list is no key)."""
    s = r.get("seed")
    return s if isinstance(s, int) and not isinstance(s, bool) else text(s)


def _utf8_problems(path: Path) -> list[str]:
    """A warning naming the file and line of each ``episodes.jsonl`` line that is not valid UTF-8 (the reader
    replaces its bad bytes with U+FFFD, so the line is shown, but not as written)."""
    out: list[str] = []
    try:
        data = path.read_bytes()
    except OSError:
        return out
    for n, line in enumerate(data.split(b"\n"), 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            out.append(f"{path}:{n}: not valid UTF-8 (byte 0x{line[e.start]:02x} at column {e.start + 1}); "
                       "its bad bytes are shown as \ufffd")
    return out


def _read_run(run_dir: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[str]]:
    """The summary (``None`` for a run without one: it is tallied later), the latest record of each episode,
    and what could not be read."""
    if (run_dir / "summary.json").exists():
        return load_run_checked(run_dir)
    if not run_dir.exists():
        raise FileNotFoundError(f"{run_dir}: not found (no such folder)")
    if not has_episodes_on_disk(run_dir):
        raise FileNotFoundError(f"{run_dir}: no summary.json, episodes.jsonl or {TRAJECTORIES}; not a run folder "
                                "of eval.run (or a trainer's run folder, or a folder of such runs)")
    all_records, problems = EpisodeLog(run_dir / "episodes.jsonl").read()
    latest: dict[str, dict[str, Any]] = {}
    for r in all_records:
        if isinstance(r, dict) and isinstance(r.get("env_id"), str) and "seed" in r:
            r["key"] = record_key(r)
            latest[r["key"]] = r
    return None, list(latest.values()), problems


def load_run_data(run_dir: Path, run_id: str, label: str | None = None) -> RunData:
    """Read one run folder (``summary.json``, ``episodes.jsonl``, optional trajectories) for the page.

    A folder without ``summary.json`` (a run still going, or killed; a trainer's held-out evaluation) is read
    from what is on disk: its summary is tallied from the episode records (:mod:`eval.view.incomplete`).
    What could not be read (a torn or non-UTF-8 ``episodes.jsonl`` line, a cut-off trajectories file) is
    skipped or shown replaced, and named in ``RunData.warnings``; ``meta`` says whether ``episodes.jsonl`` is
    missing or empty, whether the trajectories file is missing or was cut off, and how many listed episodes
    have no steps, so the page can count them and say why.

    Raises:
        FileNotFoundError: ``run_dir`` has no ``summary.json`` and no episodes either.
        ValueError: the summary is not JSON or not a crl-bench summary (no ``tasks`` object).
    """
    summary, records, problems = _read_run(run_dir)
    episodes_path, traj_path = run_dir / "episodes.jsonl", run_dir / TRAJECTORIES
    problems += _utf8_problems(episodes_path)
    with warnings.catch_warnings(record=True) as caught:  # load_trajectories warns of a torn tail
        warnings.simplefilter("always")
        loaded = load_trajectories(run_dir)
    episodes_file = ("missing" if not episodes_path.exists() else
                     "empty" if not episodes_path.read_bytes().strip() else "present")
    traj_file = "missing" if not traj_path.exists() else "cut" if caught else "present"
    trajs = {}
    for t in loaded:
        if isinstance(t, dict):
            trajs[(text(t.get("env_id")), _seed(t), _sample(t))] = t
    by_key: dict[tuple[str, int | str, int], dict[str, Any]] = {}
    for r in records:
        if isinstance(r, dict) and isinstance(r.get("env_id"), str):
            by_key[(r["env_id"], _seed(r), _sample(r))] = r
    # A trajectory whose summary line is missing (a kill between the two writes) still counts as an episode,
    # if it is one the summary is about (load_run leaves out records of other seeds, and so does this).
    run = summary.get("run") if summary is not None and isinstance(summary.get("run"), dict) else {}
    first, count = run.get("seed"), run.get("episodes")
    per_world = 1000 if isinstance(run.get("stream"), int) else 1  # a stream's seeds: world * 1000 + j
    for k, t in trajs.items():
        in_run = summary is None or (k[0] in summary["tasks"] and (
            not isinstance(first, int) or not isinstance(count, int)
            or (isinstance(k[1], int) and first <= k[1] // per_world < first + count)))
        if k not in by_key and in_run and isinstance(t.get("summary"), dict):
            by_key[k] = {**t["summary"], "env_id": k[0], "seed": k[1], "sample": k[2]}
    if summary is None:
        agent = next((text(t.get("agent")) for t in trajs.values() if t.get("agent")), "")
        summary = tally_summary(run_dir, list(by_key.values()), agent)
    tasks = list(summary["tasks"]) + sorted({k[0] for k in by_key} - set(summary["tasks"]))
    task_idx = {e: i for i, e in enumerate(tasks)}

    def order(k: tuple[str, int | str, int]) -> tuple[int, float, str, int]:
        return task_idx[k[0]], k[1] if isinstance(k[1], int) else math.inf, str(k[1]), k[2]

    data = RunData(id=run_id, label=label or agent_label(summary), folder=str(run_dir),
                   summary=slim_summary(summary), tasks=tasks, warnings=problems)
    streamed = is_stream_run(summary)
    for k in sorted(by_key, key=order):
        r, traj = by_key[k], trajs.get(k)
        data.rows.append([
            task_idx[k[0]], jsonable(k[1]), k[2], bool(r.get("success")), num(r.get("progress")),
            num(r.get("reward")), num(r.get("actions")), num(r.get("invalid_actions")),
            (text(r.get("error")).strip().splitlines() or ["error"])[0] if r.get("error") else None,
            num(r.get("tokens_in")), num(r.get("tokens_out")), num(r.get("wall_time_s")), traj is not None,
        ])
        data.payloads.append(episode_payload(traj) if traj else None)
        data.search.append(search_text(traj, r))
        data.actions.append(action_list(traj))
        entry = stream_entry(len(data.rows) - 1, r, traj) if streamed else None
        if entry is not None:
            data.stream.append({"task": task_idx[k[0]], "seed": jsonable(k[1]), **entry})
    with_steps = sum(p is not None for p in data.payloads)
    no_steps = len(data.rows) - with_steps if traj_file != "missing" else 0
    if caught:  # eval.trajectories' warning says only that one torn record was skipped: count what it cost
        data.warnings.append(
            f"{traj_path}: cut off (a killed run, or a copy cut short): {no_steps} of {len(data.rows)} episodes "
            "have no steps. They cannot be restored from these files (`eval.run --resume` drops the torn end and "
            "plays no episode that episodes.jsonl already records); to see their steps, play the run again into a "
            "new folder with the same options (the same seeds give the same episodes)")
    elif no_steps:
        data.warnings.append(f"{traj_path}: holds no record of {no_steps} of the {len(data.rows)} episodes in "
                             "episodes.jsonl, so they have no steps to show")
    data.meta = {"trajectories": with_steps, "episodes_file": episodes_file, "trajectories_file": traj_file,
                 "no_steps": no_steps}
    return data
