"""The trainer's held-out episodes on disk, in the formats ``eval.run`` writes, so ``eval.view`` shows them.

Each held-out evaluation (:func:`crl_agent.train.evaluate`) keeps its episodes in the run folder, one folder per
evaluation step and half::

    <run>/evals/step-0008/without_experience/   episodes.jsonl, trajectories.jsonl.gz, eval.json
    <run>/evals/step-0008/with_experience/      (crl and static modes)

``episodes.jsonl`` holds one ``{**Episode.summary(), "key": ...}`` line per episode and
``trajectories.jsonl.gz`` one gzip member per episode (text mode of :mod:`crl_agent.trajectory`), exactly as
an ``eval.run`` folder; ``eval.json`` says what the folder is (step, half, mode, tasks, seeds, episodes). A
folder is written whole into a temporary sibling and renamed into place, so a kill never leaves half an
evaluation, and a resumed run that plays a step's evaluation again replaces it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from crl_agent.episode import Episode
from crl_agent.trajectory import FILENAME, encode_member, make_record

EVALS_DIR = "evals"
META_FILE = "eval.json"
META_SCHEMA = "crl-bench/train-eval"


def eval_folder(run_dir: Path, step: int, with_experience: bool) -> Path:
    """Where the evaluation at ``step`` (with or without test-time experience) is kept."""
    half = "with_experience" if with_experience else "without_experience"
    return Path(run_dir) / EVALS_DIR / f"step-{step:04d}" / half


def episode_lines(episodes: list[Episode]) -> list[tuple[str, bytes]]:
    """Each episode as its ``episodes.jsonl`` line and its trajectory's gzip member (picklable, so the ranks
    of a distributed run can gather them)."""
    out = []
    for ep in episodes:
        line = json.dumps({**ep.summary(), "key": ep.key}, default=str)  # a non-JSON extra must not lose it
        out.append((line, encode_member(make_record(ep.to_dict(), json.loads(line), "text"))))
    return out


def write_eval(folder: Path, lines: list[tuple[str, bytes]], meta: dict[str, Any]) -> Path:
    """Write one evaluation half's folder (see the module docstring) atomically; returns it."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "episodes.jsonl").write_text("".join(line + "\n" for line, _ in lines), encoding="utf-8")
    (tmp / FILENAME).write_bytes(b"".join(member for _, member in lines))
    (tmp / META_FILE).write_text(json.dumps({"schema": META_SCHEMA, **meta, "episodes": len(lines)}, indent=2)
                                 + "\n", encoding="utf-8")
    for f in tmp.iterdir():
        with f.open("rb") as fh:
            os.fsync(fh.fileno())
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder
