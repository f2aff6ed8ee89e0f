"""Generated ALFWorld games on disk: generate once, verify by winning with a plan, cache, reuse.

The cache is ``$CRL_CACHE/alfworld/v<generator version>/<task type>/seed_<seed>/`` (default
``~/.cache/crl-bench``). Each game folder has the official layout, so the official loader can
read a cache tree too:

* ``game.tw-pddl``: JSON with ``pddl_domain``, ``grammar`` (goal text filled in), ``pddl_problem``,
  ``solvable`` (true), ``walkthrough`` (the planner's plan, replayed and checked to win) and
  ``crl`` (the task spec);
* ``traj_data.json``: ``task_type`` and ``pddl_params``, as in ALFRED's trajectory files.

A cached game that does not parse or lacks a key is regenerated with a warning.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import warnings
from typing import Any

from crl_envs.alfworld.engine import Player
from crl_envs.alfworld.generator import (
    GENERATOR_VERSION,
    TASK_TYPES,
    GenerationError,
    TaskSpec,
    build_problem,
    game_data,
)
from crl_envs.alfworld.solver import Goal, plan_from_engine

GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough")
_MAX_ATTEMPTS = 20


def cache_root() -> str:
    """``$CRL_CACHE`` or ``~/.cache/crl-bench``."""
    return os.environ.get("CRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "crl-bench")


def game_dir(task_type: str, seed: int, root: str | None = None) -> str:
    return os.path.join(root or os.path.join(cache_root(), "alfworld"), f"v{GENERATOR_VERSION}", task_type,
                        f"seed_{int(seed)}")


@functools.lru_cache(maxsize=1)
def _default_player() -> Player:
    return Player()


def traj_data(spec: TaskSpec) -> dict[str, Any]:
    """The parts of ALFRED's ``traj_data.json`` that loaders read."""
    return {
        "task_type": spec.task_type,
        "scene": {"floor_plan": f"FloorPlan{spec.floor_plan}"},
        "pddl_params": {"object_target": spec.object_target, "parent_target": spec.parent_target,
                        "toggle_target": spec.toggle_target, "mrecep_target": "", "object_sliced": False},
        "crl": spec.to_json(),
    }


def read_game(path: str) -> dict[str, Any]:
    """Load and validate a ``game.tw-pddl`` file; raise ``ValueError`` naming what is wrong."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable game file ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a game file must hold a JSON object")
    missing = [k for k in GAME_KEYS if k not in data]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}")
    return data


def _is_valid_cached(data: dict[str, Any], task_type: str, seed: int) -> str | None:
    spec = data.get("crl") or {}
    if spec.get("task_type") != task_type or spec.get("seed") != seed:
        return "it belongs to another task type or seed"
    if spec.get("generator_version") != GENERATOR_VERSION:
        return "it was made by another generator version"
    if data.get("solvable") is not True or not isinstance(data.get("walkthrough"), list) or not data["walkthrough"]:
        return "it has no verified plan"
    return None


def _write_json(path: str, data: dict[str, Any]) -> None:
    """Atomic write, so concurrent workers never read half a file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def verify(game_file: str, goal: Goal, player: Player | None = None) -> list[str] | None:
    """Plan from the initial facts, replay the plan in TextWorld, and return it if it wins."""
    player = player or _default_player()
    _, infos = player.load(game_file)
    plan = plan_from_engine(player.pddl_env, goal)
    if not plan:
        return None
    for command in plan:
        if command not in infos["admissible_commands"]:
            return None
        _, _, done, infos = player.step(command)
    return plan if infos["won"] else None


def generate_game(task_type: str, seed: int, directory: str, player: Player | None = None) -> dict[str, Any]:
    """Generate, verify and write a game for ``(task_type, seed)`` into ``directory``."""
    for attempt in range(_MAX_ATTEMPTS):
        spec, problem = build_problem(task_type, seed, attempt)
        data = game_data(spec, problem)
        # Verify a private candidate file: concurrent readers only ever see verified games.
        candidate = os.path.join(directory, f".candidate-{os.getpid()}.tw-pddl")
        _write_json(candidate, data)
        try:
            plan = verify(candidate, Goal.from_params(task_type, traj_data(spec)["pddl_params"]), player)
        finally:
            os.unlink(candidate)
        if plan is None:
            continue
        data["solvable"], data["walkthrough"] = True, plan
        _write_json(os.path.join(directory, "traj_data.json"), traj_data(spec))
        _write_json(os.path.join(directory, "game.tw-pddl"), data)
        return data
    raise GenerationError(f"no solvable {task_type} game for seed {seed} after {_MAX_ATTEMPTS} attempts")


def get_game(task_type: str, seed: int, *, root: str | None = None, player: Player | None = None) -> str:
    """Path of the verified ``game.tw-pddl`` for ``(task_type, seed)``, generating it on a cache miss."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown ALFWorld task type {task_type!r}; use one of {', '.join(TASK_TYPES)}")
    directory = game_dir(task_type, seed, root)
    path = os.path.join(directory, "game.tw-pddl")
    if os.path.exists(path):
        try:
            problem = _is_valid_cached(read_game(path), task_type, int(seed))
        except ValueError as e:
            problem = str(e)
        if problem is None and os.path.exists(os.path.join(directory, "traj_data.json")):
            return path
        warnings.warn(f"regenerating the cached ALFWorld game {path}: {problem or 'traj_data.json is missing'}",
                      stacklevel=2)
    generate_game(task_type, int(seed), directory, player)
    return path
