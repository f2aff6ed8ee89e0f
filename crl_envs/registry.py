"""Every crl-bench id, registered in one place, plus third-party plugins.

Ids look like ``crl/<Family>-<Variant>-v<N>``. Entry points are strings, so
``gymnasium.make`` imports a family's backend only when one of its envs is built.
Bump ``vN`` whenever an env's behaviour changes.

Third-party packages register envs through the entry-point group ``crl_envs.plugins``:
each entry point names a zero-argument callable that calls ``gymnasium.register``.
Gymnasium 1.x no longer loads plugin entry points itself, so we do it at import.
"""

from __future__ import annotations

import difflib
import importlib.util
import warnings
from dataclasses import dataclass
from importlib.metadata import entry_points

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

PLUGIN_GROUP = "crl_envs.plugins"


@dataclass(frozen=True)
class Family:
    """An env family: where it lives, which import it needs, and the extra that installs it."""

    name: str
    module: str
    requires: tuple[str, ...]
    extra: str | None

    def installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.requires)


FAMILIES: dict[str, Family] = {
    "Sokoban": Family("Sokoban", "crl_envs.sokoban", (), None),
    "MiniHack": Family("MiniHack", "crl_envs.minihack", ("nle", "minihack"), "minihack"),
    "ALFWorld": Family("ALFWorld", "crl_envs.alfworld", ("alfworld", "textworld"), "alfworld"),
    "WebShop": Family("WebShop", "crl_envs.webshop", ("bm25s",), "webshop"),
    "SWE": Family("SWE", "crl_envs.swe", ("swebench",), "swe"),
    "Remote": Family("Remote", "crl_envs.remote", ("websockets",), "openenv"),
}


def _register(env_id: str, entry_point: str, max_episode_steps: int, **kwargs) -> None:
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=entry_point, max_episode_steps=max_episode_steps, kwargs=kwargs)


def register_builtin_envs() -> None:
    """Register every built-in id (cheap: no backend is imported)."""
    # ---------------------------------------------------------------- Sokoban
    # Default 6x6 with 2 boxes, as in the official Complementary RL code; 100 steps
    # per episode as in gym-sokoban's default (max_steps=120) rounded to the peers' GEM cap.
    for size, boxes in [(6, 1), (6, 2), (7, 2), (8, 2), (8, 3)]:
        _register(
            f"crl/Sokoban-{size}x{size}-{boxes}-v0",
            "crl_envs.sokoban.env:SokobanEnv",
            100,
            size=size,
            num_boxes=boxes,
        )
    # ---------------------------------------------------------------- MiniHack
    # Episode limits are MiniHack's own defaults for each task (env._max_episode_steps):
    # 100 for 5x5 rooms, 300 for 15x15 rooms, 200/1000 for mazes, 200/400 for KeyRoom S5/S15.
    minihack_tasks = {
        "Room-5x5": 100, "Room-15x15": 300,
        **{f"Room-{v}-{s}": n for v in ("Random", "Dark", "Monster", "Trap", "Ultimate")
           for s, n in (("5x5", 100), ("15x15", 300))},
        "MazeWalk-9x9": 200, "MazeWalk-15x15": 1000, "MazeWalk-45x19": 1000,
        "MazeWalk-Mapped-9x9": 200, "MazeWalk-Mapped-15x15": 1000, "MazeWalk-Mapped-45x19": 1000,
        "KeyRoom-S5": 200, "KeyRoom-S15": 400, "KeyRoom-Fixed-S5": 200,
        "KeyRoom-Dark-S5": 200, "KeyRoom-Dark-S15": 400,
    }
    for variant, steps in minihack_tasks.items():
        _register(f"crl/MiniHack-{variant}-v0", "crl_envs.minihack.env:MiniHackTextEnv", steps,
                  task=f"MiniHack-{variant}-v0")
    # Learning-ready: start and staircase vary by seed (1-4 moves apart) and 16 steps per episode
    # (the learning prototype's cap, DESIGN.md section 9), so uniform random wins about a third of the
    # episodes and the oracle all of them (benchmarks/minihack_learnable.py): inside the 20-60% band
    # where group RL sees both wins and losses, with room for a prior worse than random.
    _register("crl/MiniHack-Room-Random-5x5-Short-v0", "crl_envs.minihack.env:MiniHackTextEnv", 16,
              task="MiniHack-Room-Random-5x5-v0")
    # Persistent worlds (the experience track, crl_envs/persistent.py): seed s plays episode s % 1000 of
    # world s // 1000. One of K dark corridors goes through, the same in every episode of a world. The caps
    # let an agent that remembers the corridor win (oracle with memory: 100% over 90 held-out episodes)
    # while one that must try corridors wins about when its first guess is right (31% at K=3, 18% at K=5).
    _register("crl/MiniHack-Corridors-3-v0", "crl_envs.minihack.corridors:MiniHackCorridorsEnv", 20,
              corridors=3, length=6)
    _register("crl/MiniHack-Corridors-5-v0", "crl_envs.minihack.corridors:MiniHackCorridorsEnv", 22,
              corridors=5, length=5)
    # ---------------------------------------------------------------- ALFWorld
    # 50 steps per episode: ALFWorld's standard budget (ReAct, Reflexion, AgentBench, Complementary RL).
    # Generated games need no data; Official reads $ALFWORLD_DATA (make fails with instructions without it).
    _register("crl/ALFWorld-v0", "crl_envs.alfworld.env:ALFWorldEnv", 50, task_type="all")
    for variant, task_type in [("PickPlace", "pick_and_place_simple"), ("Look", "look_at_obj_in_light"),
                               ("PickClean", "pick_clean_then_place_in_recep"),
                               ("PickHeat", "pick_heat_then_place_in_recep"),
                               ("PickCool", "pick_cool_then_place_in_recep"), ("PickTwo", "pick_two_obj_and_place")]:
        _register(f"crl/ALFWorld-{variant}-v0", "crl_envs.alfworld.env:ALFWorldEnv", 50, task_type=task_type)
    # Persistent worlds (the experience track): one household per world, the goals change; 10 steps let the
    # solver that remembers where things are win (100% of 30 held-out episodes) and one that searches 17%.
    _register("crl/ALFWorld-House-v0", "crl_envs.alfworld.house:ALFWorldHouseEnv", 10)
    _register("crl/ALFWorld-Official-v0", "crl_envs.alfworld.env:ALFWorldEnv", 50, source="official",
              split="valid_unseen")
    # ---------------------------------------------------------------- WebShop
    # 15 steps per episode as the ReAct/AgentBench WebShop evaluations. The default split is
    # the official test split (goals 0-499; reset seed i serves goal i); split="train" for RL.
    _register("crl/WebShop-v0", "crl_envs.webshop.env:WebShopEnv", 15, source="generated", split="test")
    _register("crl/WebShop-Official-v0", "crl_envs.webshop.env:WebShopEnv", 15, source="official", split="test")
    # ---------------------------------------------------------------- SWE-bench
    # SWE-Mini: the bundled offline set (seed picks the instance); SWE-Bench: real instances from
    # instances=PATH or $SWE_INSTANCES. Sandbox: bwrap by default (see crl_envs/swe/sandbox.py).
    _register("crl/SWE-Mini-v0", "crl_envs.swe.env:SWEEnv", 30, bundled=True, max_steps=30)
    _register("crl/SWE-Bench-v0", "crl_envs.swe.env:SWEEnv", 100, max_steps=100)
    # ---------------------------------------------------------------- Remote
    # Any env served by `python -m crl_envs.serve`, played over OpenEnv's protocol (url= or $CRL_REMOTE_URL).
    # The served env truncates at its own limit; this one only bounds a server whose env has none.
    _register("crl/Remote-v0", "crl_envs.remote:RemoteEnv", 1000)


def load_plugins() -> list[str]:
    """Load every ``crl_envs.plugins`` entry point; return the names that loaded.

    A broken plugin warns instead of breaking ``import crl_envs``.
    """
    loaded = []
    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            fn = ep.load()
            if callable(fn):
                fn()
            loaded.append(ep.name)
        except Exception as e:  # noqa: BLE001 - a bad plugin must not break the suite
            warnings.warn(f"crl_envs plugin {ep.name!r} ({ep.value}) failed to load: {e}", stacklevel=2)
    return loaded


def crl_env_ids() -> list[str]:
    """Sorted ids of every built-in env (sorted, so pytest-xdist workers agree)."""
    return sorted(i for i in gym.registry if i.startswith("crl/"))


def family_of(env_id: str) -> Family | None:
    """The built-in family of an id, or ``None`` for a third-party env."""
    spec = gym.spec(env_id)
    ep = spec.entry_point if isinstance(spec.entry_point, str) else ""
    for fam in FAMILIES.values():
        if ep.startswith((fam.module + ".", fam.module + ":")):  # a family package, or a module (Remote)
            return fam
    return None


def backend_installed(env_id: str) -> bool:
    fam = family_of(env_id)
    return True if fam is None else fam.installed()


def check_env_id(env_id: str) -> None:
    """Raise a helpful error for an unknown id or a missing backend."""
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise gym.error.NameNotFound(
            f"Unknown env id {env_id!r}.{hint} Run `python -m crl_envs list` for every id."
        )
    fam = family_of(env_id)
    if fam is not None and not fam.installed():
        raise gym.error.DependencyNotInstalled(
            f"{env_id} needs the {fam.name} backend: pip install -e \".[{fam.extra}]\""
        )


def env_class(env_id: str) -> type:
    """The class of ``env_id``'s envs, read without building one (its module is imported, nothing else).

    Harnesses read class attributes through it, e.g. ``step_time_limit_s`` or whether the env
    ships a solver (:func:`has_solver`). An entry point that is a factory function rather than
    a class gives no class until it runs: for those alone, one env is built, its unwrapped
    class taken, and the env closed.

    Raises:
        gymnasium.error.NameNotFound, gymnasium.error.DependencyNotInstalled: as :func:`check_env_id`.
    """
    check_env_id(env_id)
    spec = gym.spec(env_id)
    creator = spec.entry_point
    if isinstance(creator, str):
        creator = load_env_creator(creator)
    if isinstance(creator, type):
        return creator
    env = gym.make(spec)  # a factory: only its product knows the class
    try:
        return type(env.unwrapped)
    finally:
        env.close()


def has_solver(env_id: str) -> bool:
    """Whether ``env_id`` ships a solver, i.e. its class overrides ``TextEnv.oracle_action`` (``--agent oracle``)."""
    from crl_envs.core import TextEnv

    impl = getattr(env_class(env_id), "oracle_action", None)
    return callable(impl) and impl is not TextEnv.oracle_action


def make(env_id: str, **kwargs) -> gym.Env:
    """``gymnasium.make`` with clear errors for unknown ids and missing backends."""
    check_env_id(env_id)
    return gym.make(env_id, **kwargs)
