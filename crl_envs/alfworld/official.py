"""The official ALFWorld games (``$ALFWORLD_DATA/json_2.1.1/<split>/<task>/<trial>/``), found as alfworld does.

``alfworld-download`` unpacks the games under ``$ALFWORLD_DATA`` (default ``~/.cache/alfworld``):
``json_2.1.1/{train,valid_seen,valid_unseen}/<task_type>-<object>-<mrecep>-<parent>-<scene>/trial_T.../``,
each trial with ``traj_data.json``, ``initial_state.pddl`` and, for most trials, ``game.tw-pddl``.
``ALFWORLD_DATA`` (or ``data_path``) may name that parent folder or ``json_2.1.1`` itself.

alfworld's ``AlfredTWEnv.collect_game_files`` rules, applied here:

* a game is a folder holding ``traj_data.json`` and ``game.tw-pddl`` (trials without
  ``game.tw-pddl`` are skipped);
* paths containing ``movable`` or ``Sliced`` are skipped (we look only below the split folder,
  so a data folder whose own path holds those words still works);
* so are task types outside the six, and games whose ``game.tw-pddl`` lacks ``solvable`` or has
  it false.

Where alfworld would crash on a broken file (a ``traj_data.json`` or ``game.tw-pddl`` that is not
JSON, or lacks a field it reads), :class:`OfficialDataError` names the file and the field.

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
JSON_DIR = "json_2.1.1"
DEFAULT_DATA = os.path.join("~", ".cache", "alfworld")  # alfworld-download's default folder
GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem")
HOW_TO_GET = ("get the official games with `pip install alfworld==0.4.2 && alfworld-download` (needs internet), "
              "then set ALFWORLD_DATA to the folder that holds json_2.1.1; or play the generated games "
              "(crl/ALFWorld-v0), which need no data")


class OfficialDataNotFound(FileNotFoundError):
    """The official ALFWorld games are not where ``ALFWORLD_DATA`` (or ``data_path``) points."""


class OfficialDataError(ValueError):
    """An official game's ``traj_data.json`` or ``game.tw-pddl`` is broken; the message names file and field."""


def data_root(data_path: str | None = None) -> str | None:
    """``data_path``, else ``$ALFWORLD_DATA``, else alfworld's default ``~/.cache/alfworld`` if it holds games.

    ``~`` and ``$VARS`` are expanded (alfworld expands them too). ``None`` when nothing is set and
    the default folder has no ``json_2.1.1``.
    """
    root = data_path or os.environ.get("ALFWORLD_DATA") or None
    if root is None:
        default = os.path.expanduser(DEFAULT_DATA)
        return default if os.path.isdir(os.path.join(default, JSON_DIR)) else None
    return os.path.expanduser(os.path.expandvars(str(root)))


def split_dir(split: str, data_path: str | None = None) -> str:
    """The folder of a split; raises :class:`OfficialDataNotFound` with instructions when absent.

    The root may be the folder holding ``json_2.1.1`` (as ``alfworld-download`` lays it out) or
    ``json_2.1.1`` itself.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; use one of {', '.join(SPLITS)}")
    root = data_root(data_path)
    if root is None:
        raise OfficialDataNotFound(f"ALFWorld data not found: ALFWORLD_DATA is not set and {DEFAULT_DATA} has no "
                                   f"{JSON_DIR}; {HOW_TO_GET}")
    candidates = [os.path.join(root, JSON_DIR, split), os.path.join(root, split)]
    for path in candidates:
        if os.path.isdir(path):
            return path
    raise OfficialDataNotFound(f"ALFWorld data not found in {candidates[0]} (nor {candidates[1]}); {HOW_TO_GET}")


def _load_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise OfficialDataError(f"{path}: not a readable JSON file ({e}); re-extract it with "
                                "`alfworld-download -f`, or delete its trial folder") from e


def _task_type(traj_file: str) -> str:
    data = _load_json(traj_file)
    task_type = data.get("task_type") if isinstance(data, dict) else None
    if not isinstance(task_type, str):
        raise OfficialDataError(f"{traj_file}: field 'task_type' is missing or not a string (alfworld reads it to "
                                "pick the task type); re-extract it with `alfworld-download -f`")
    return task_type


def _playable(game_file: str) -> bool:
    """alfworld's rule (``solvable`` present and true), after checking the fields the engine needs."""
    data = _load_json(game_file)
    if not isinstance(data, dict):
        raise OfficialDataError(f"{game_file}: a game.tw-pddl file must hold a JSON object, "
                                f"not {type(data).__name__}")
    if not data.get("solvable"):
        return False
    bad = [k for k in GAME_KEYS if not isinstance(data.get(k), str) or not data[k].strip()]
    if bad:
        raise OfficialDataError(f"{game_file}: field {bad[0]!r} is missing or empty (a game needs "
                                f"{', '.join(GAME_KEYS)}); regenerate it with `alfworld-generate`")
    return True


@functools.lru_cache(maxsize=16)
def _collect(path: str, task_types: tuple[str, ...], mtime: float) -> tuple[str, ...]:
    games = []
    for root, _, files in os.walk(path):
        if "traj_data.json" not in files:
            continue
        below = os.path.relpath(root, path)
        if "movable" in below or "Sliced" in below:
            continue
        if _task_type(os.path.join(root, "traj_data.json")) not in task_types:
            continue
        game_file = os.path.join(root, "game.tw-pddl")
        if os.path.isfile(game_file) and _playable(game_file):
            games.append(game_file)
    return tuple(sorted(games))


def official_games(split: str = "valid_unseen", data_path: str | None = None,
                   task_types: tuple[str, ...] = TASK_TYPES) -> tuple[str, ...]:
    """Sorted ``game.tw-pddl`` paths of a split, filtered by alfworld's rules.

    Raises:
        OfficialDataNotFound: the split folder is missing, or holds no playable game.
        OfficialDataError: a ``traj_data.json`` or ``game.tw-pddl`` is not JSON or lacks a field.
    """
    path = split_dir(split, data_path)
    games = _collect(path, tuple(task_types), os.path.getmtime(path))
    if not games:
        raise OfficialDataNotFound(f"no playable ALFWorld game under {path} (task types {', '.join(task_types)}); "
                                   f"{HOW_TO_GET}")
    return games


def game_params(game_file: str) -> tuple[str, dict[str, Any]]:
    """(task type, ``pddl_params``) of a game, from its ``traj_data.json``, else the ``crl`` spec."""
    traj = _read_dict(os.path.join(os.path.dirname(game_file), "traj_data.json"))
    params, task_type = traj.get("pddl_params"), traj.get("task_type")
    if not isinstance(params, dict) or not task_type:
        spec = _read_dict(game_file).get("crl")
        spec = spec if isinstance(spec, dict) else {}
        params = params if isinstance(params, dict) else spec
        task_type = task_type or spec.get("task_type") or ""
    return str(task_type), dict(params)


def _read_dict(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
