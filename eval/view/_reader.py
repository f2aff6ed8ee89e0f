"""A stop-gap reader of ``trajectories.jsonl.gz`` (trajectory schema 1.0, see the lead's contract).

Used only until ``eval.trajectories.load_trajectories`` exists; :func:`load_trajectories` in
``eval.view.data`` prefers that one. Same rules: gzip members appended one per episode, a torn last
member is skipped with a warning, the newest record per ``key`` wins, and a run folder without the
file has no trajectories (an older run: summaries only).
"""

from __future__ import annotations

import gzip
import json
import warnings
import zlib
from pathlib import Path
from typing import Any

FILENAME = "trajectories.jsonl.gz"


def read_trajectories(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete trajectory record of ``run_dir``, newest per key, in file order of first appearance."""
    path = Path(run_dir) / FILENAME
    if not path.exists():
        return []
    newest: dict[str, dict[str, Any]] = {}
    lines: list[bytes] = []
    try:
        with gzip.open(path, "rb") as f:
            for line in f:
                lines.append(line)
    except (EOFError, OSError, zlib.error) as e:  # a run killed mid-write leaves a torn last member
        warnings.warn(f"{path}: torn or corrupt data after {len(lines)} records skipped ({e})", stacklevel=2)
    for line in lines:
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # the torn member's partial line
        if isinstance(rec, dict) and isinstance(rec.get("key"), str):
            newest[rec["key"]] = rec
    return list(newest.values())
