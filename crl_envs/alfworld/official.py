"""The official ALFWorld games (``$ALFWORLD_DATA/json_2.1.1/<split>/<task>/<trial>/``), found as alfworld does.

alfworld's ``AlfredTWEnv.collect_game_files`` rules, applied here:

* a game is a folder holding ``traj_data.json`` and ``game.tw-pddl``;
* paths containing ``movable`` or ``Sliced`` are skipped;
* so are task types outside the six, and games whose ``game.tw-pddl`` lacks ``solvable`` or has
  it false.

Games are listed in sorted path order, so game ``i`` is the same everywhere; the real
``valid_unseen`` split (the out-of-distribution eval set) has 134 games, ``valid_seen`` 140 and
``train`` 3553.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from crl_envs.alfworld.generator import TASK_TYPES

SPLITS = ("train", "valid_seen", "valid_unseen")
HOW_TO_GET = ("get the official games with `pip install alfworld==0.4.2 && alfworld-download` (needs internet), "
              "then set ALFWORLD_DATA to the folder that holds json_2.1.1; or play the generated games "
              "(crl/ALFWorld-v0), which need no data")


class OfficialDataNotFound(FileNotFoundError):
    """The official ALFWorld games are not where ``ALFWORLD_DATA`` (or ``data_path``) points."""


def data_root(data_path: str | None = None) -> str | None:
    """``data_path``, else ``$ALFWORLD_DATA`` (``None`` when neither is set)."""
    return data_path or os.environ.get("ALFWORLD_DATA") or None


def split_dir(split: str, data_path: str | None = None) -> str:
    """The folder of a split; raises :class:`OfficialDataNotFound` with instructions when absent."""
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; use one of {', '.join(SPLITS)}")
    root = data_root(data_path)
    if root is None:
        raise OfficialDataNotFound(f"ALFWorld data not found: ALFWORLD_DATA is not set; {HOW_TO_GET}")
    path = os.path.join(os.path.expanduser(root), "json_2.1.1", split)
    if not os.path.isdir(path):
        raise OfficialDataNotFound(f"ALFWorld data not found in {path}; {HOW_TO_GET}")
    return path


def _readable_game(game_file: str) -> bool:
    try:
        with open(game_file) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and bool(data.get("solvable"))


@functools.lru_cache(maxsize=16)
def _collect(path: str, task_types: tuple[str, ...], mtime: float) -> tuple[str, ...]:
    games = []
    for root, _, files in os.walk(path):
        if "traj_data.json" not in files:
            continue
        if "movable" in root or "Sliced" in root:
            continue
        try:
            with open(os.path.join(root, "traj_data.json")) as f:
                task_type = json.load(f).get("task_type")
        except (OSError, ValueError, AttributeError):
            continue
        game_file = os.path.join(root, "game.tw-pddl")
        if task_type in task_types and os.path.exists(game_file) and _readable_game(game_file):
            games.append(game_file)
    return tuple(sorted(games))


def official_games(split: str = "valid_unseen", data_path: str | None = None,
                   task_types: tuple[str, ...] = TASK_TYPES) -> tuple[str, ...]:
    """Sorted ``game.tw-pddl`` paths of a split, filtered by alfworld's rules.

    Raises:
        OfficialDataNotFound: the split folder is missing, or holds no playable game.
    """
    path = split_dir(split, data_path)
    games = _collect(path, tuple(task_types), os.path.getmtime(path))
    if not games:
        raise OfficialDataNotFound(f"no playable ALFWorld game under {path} (task types {', '.join(task_types)}); "
                                   f"{HOW_TO_GET}")
    return games


def game_params(game_file: str) -> tuple[str, dict[str, Any]]:
    """(task type, ``pddl_params``) of a game, from its ``traj_data.json`` or the ``crl`` spec."""
    traj = os.path.join(os.path.dirname(game_file), "traj_data.json")
    try:
        with open(traj) as f:
            data = json.load(f)
        return str(data.get("task_type", "")), dict(data.get("pddl_params") or {})
    except (OSError, ValueError):
        pass
    try:
        with open(game_file) as f:
            spec = json.load(f).get("crl") or {}
    except (OSError, ValueError, AttributeError):
        spec = {}
    return str(spec.get("task_type", "")), spec
