"""ALFWorld House: a persistent household where the things stay where they are while goals change.

A *world* is one generated scene (a real AI2-THOR floor plan, its receptacles, and every object
in a receptacle, many of them closed) plus the three things its residents keep asking for: object
classes the scene holds exactly once. An *episode* of the world asks for one of them
("put a mug in drawer") and starts the agent somewhere else; the scene itself never changes. So
where the mug is can be learned once and used in every later episode; an agent that does not
remember must open receptacles until it finds it, and the step budget allows only a few.

Games are written with :mod:`crl_envs.alfworld.generator`'s PDDL writer, verified by winning them
with the planner's plan (as every generated game is), and cached under
``$CRL_CACHE/alfworld/house/v<HOUSE_VERSION>/world_<w>/episode_<j>/``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any

import numpy as np

from crl_envs.alfworld import scene as sc
from crl_envs.alfworld.env import ALFWorldEnv
from crl_envs.alfworld.generator import GenerationError, TaskSpec, game_data, write_problem
from crl_envs.persistent import EPISODES_PER_WORLD, episode_of, merge_facts, world_of

HOUSE_VERSION = 1
TASK_TYPE = "pick_and_place_simple"
WANTED = 3  # object classes a household keeps asking for
_ARTICLE = re.compile(r"\b(?:a|an)\s+")


@dataclasses.dataclass(frozen=True)
class World:
    """One household: its scene and the object classes its goals ask for."""

    world: int
    scene: sc.Scene
    wanted: tuple[str, ...]


@functools.lru_cache(maxsize=64)
def make_world(world: int) -> World:
    """The scene of ``world`` (deterministic): a kitchen or living room with several single objects hidden away."""
    rng = np.random.default_rng([int(world), HOUSE_VERSION, 0x4005E])
    plans = sc.floor_plans(("Kitchen", "LivingRoom"))
    openable = sc.openable_classes()
    for _ in range(200):
        plan = plans[int(rng.integers(len(plans)))]
        scene = sc.build_scene(plan, rng)
        recep_cls = {r.id: r.cls for r in scene.receptacles}
        counts: dict[str, int] = {}
        for o in scene.objects:
            counts[o.cls] = counts.get(o.cls, 0) + 1
        # single objects, not lamps, with some receptacle class that can hold them and does not already
        candidates = sorted(c for c, n in counts.items() if n == 1 and c not in sc.LAMPS
                            and _goal_receptacles(scene, c))
        hidden = [c for c in candidates if recep_cls[scene.objects_of(c)[0].receptacle] in openable]
        if len(candidates) < WANTED or not hidden or len(scene.receptacles) < 12:
            continue
        # at least one of the wanted things is behind a door; the rest are anywhere
        first = hidden[int(rng.integers(len(hidden)))]
        rest = [c for c in candidates if c != first]
        picked = [first, *(rest[i] for i in rng.choice(len(rest), size=WANTED - 1, replace=False))]
        return World(int(world), scene, tuple(picked))
    raise GenerationError(f"no household fits world {world}")


def _goal_receptacles(scene: sc.Scene, obj_cls: str) -> list[str]:
    """Receptacle classes of the scene that can hold ``obj_cls`` and do not hold it at the start."""
    start = {o.receptacle for o in scene.objects_of(obj_cls)}
    start_cls = {r.cls for r in scene.receptacles if r.id in start}
    return sorted({r.cls for r in scene.receptacles if sc.can_contain(r.cls, obj_cls)} - start_cls)


def episode_task(world: int, episode: int) -> tuple[TaskSpec, sc.Scene]:
    """The task and scene (start moved) of ``episode`` in ``world``."""
    w = make_world(world)
    rng = np.random.default_rng([int(world), int(episode), HOUSE_VERSION, 0xE915])
    obj = w.wanted[int(rng.integers(len(w.wanted)))]
    holders = _goal_receptacles(w.scene, obj)
    recep = holders[int(rng.integers(len(holders)))]
    _, _, grid = sc.floor_plan_data(w.scene.floor_plan)
    start = sc._agent_start(grid, {r.location for r in w.scene.receptacles}, rng)
    scene = dataclasses.replace(w.scene, objects=list(w.scene.objects), agent_location=start)
    from crl_envs.alfworld.generator import _goal_library

    templates = _goal_library()[TASK_TYPE]["templates"]
    text = templates[int(rng.integers(len(templates)))].format(obj=obj.lower(), recep=recep.lower(), toggle="",
                                                               mrecep="")
    seed = int(world) * 1000 + int(episode)
    return TaskSpec(TASK_TYPE, obj, recep, "", w.scene.floor_plan, text, seed), scene


def house_game(world: int, episode: int, player=None, root: str | None = None) -> str:
    """Path of the verified ``game.tw-pddl`` of ``episode`` in ``world``, generating it on a cache miss."""
    from crl_envs.alfworld.games import _write_json, cache_root, read_game, traj_data, verify
    from crl_envs.alfworld.solver import Goal

    directory = os.path.join(root or os.path.join(cache_root(), "alfworld", "house"), f"v{HOUSE_VERSION}",
                             f"world_{int(world)}", f"episode_{int(episode)}")
    path = os.path.join(directory, "game.tw-pddl")
    if os.path.exists(path) and os.path.exists(os.path.join(directory, "traj_data.json")):
        try:
            if read_game(path).get("solvable") is True:
                return path
        except ValueError:
            pass
    spec, scene = episode_task(world, episode)
    data = game_data(spec, write_problem(spec, scene))
    candidate = os.path.join(directory, f".candidate-{os.getpid()}.tw-pddl")
    _write_json(candidate, data)
    try:
        plan = verify(candidate, Goal.from_params(TASK_TYPE, traj_data(spec)["pddl_params"]), player)
    finally:
        os.unlink(candidate)
    if plan is None:
        raise GenerationError(f"ALFWorld house world {world} episode {episode}: the planner found no winning plan")
    data["solvable"], data["walkthrough"] = True, plan
    _write_json(os.path.join(directory, "traj_data.json"), traj_data(spec))
    _write_json(path, data)
    return path


# ------------------------------------------------------------------ reading what the agent saw
_ARRIVE = re.compile(r"(?:You arrive at|You open) (?:the )?([a-z]+(?: [a-z]+)* \d+)\.")
_SEE = re.compile(r"(?:On the [a-z ]+ \d+|In it), you see (.+?)\.")
_CLOSED = re.compile(r"The ([a-z]+(?: [a-z]+)* \d+) is closed\.")


def seen_in(observation: str) -> tuple[str | None, list[str] | None]:
    """``(receptacle, objects seen in it)`` from one observation, e.g. ``("drawer 2", ["mug 1"])``.

    ``objects`` is ``None`` where the observation does not show the inside (a closed receptacle),
    ``[]`` where it shows nothing.
    """
    m = _ARRIVE.search(observation)
    if not m:
        return None, None
    recep = m.group(1)
    if _CLOSED.search(observation) and "In it" not in observation:
        return recep, None
    s = _SEE.search(observation)
    if not s:
        return recep, [] if "you see nothing" in observation else None
    items = [_ARTICLE.sub("", x).strip() for x in re.split(r",\s*(?:and\s+)?|\s+and\s+", s.group(1))]
    return recep, [x for x in items if x]


# ------------------------------------------------------------------------------------------ the env


class ALFWorldHouseEnv(ALFWorldEnv):
    """ALFWorld House: the same household in every episode of a world; the goals change.

    ## Description
    One generated ALFWorld household per world (a real floor plan, receptacles, objects, many of
    them behind closed doors), played on TextWorld's PDDL engine as :class:`ALFWorldEnv` plays
    every game. Each episode asks to put one of the household's three recurring things
    (object classes it holds exactly once) into a receptacle class, from a new start. Where those
    things are never changes within a world, so it can be learned once; finding one without that
    knowledge means opening receptacles, and the step budget allows only a few.

    ## Action Space
    As :class:`ALFWorldEnv`: one of ``info["admissible_actions"]``.

    ## Observation Space
    The engine's text. The task line names the household: ``Your task is to: put a statue in
    coffeetable.`` and ``info["task"]`` is ``In household <world>: put a statue in coffeetable.``

    ## Starting State
    ``reset(seed=s)`` plays episode ``s % 1000`` of world (household) ``s // 1000``
    (:mod:`crl_envs.persistent`). Games are generated on first use and cached.

    ## Rewards
    1 on the step that wins the game, else 0.

    ## Episode End
    Terminates when won; truncates at ``max_episode_steps`` (a tight budget, see the registry).

    ## Information
    The ALFWorld keys, plus ``world`` and ``facts``: ``{"locations": {object class: receptacle},
    "searched": [receptacles whose inside this episode has seen]}``.

    ## Arguments
    ``render_mode``.

    ## Version History
    * v0: initial version (house generator version 1).
    """

    def __init__(self, render_mode: str | None = None):
        super().__init__(task_type=TASK_TYPE, render_mode=render_mode)
        self._world = 0
        self._facts: dict[str, Any] = {}
        self._receptacles: list[str] = []
        self._here: tuple[str | None, list[str] | None] = (None, None)

    def _pick_game(self, options: dict[str, Any] | None) -> str:
        if options and options.get("game_file"):
            return super()._pick_game(options)
        if self._reset_seed is None:
            world, episode = int(self.np_random.integers(1000)), int(self.np_random.integers(EPISODES_PER_WORLD))
        else:
            world, episode = world_of(self._reset_seed), episode_of(self._reset_seed)
        self._world = world
        return house_game(world, episode, player=self._ensure_player())

    def _reset_task(self, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        obs, info = super()._reset_task(options)
        self._facts = {"locations": {}, "searched": []}
        self._here = (None, None)
        m = re.search(r"you see (.+?)\.\n", obs + "\n")
        self._receptacles = [_ARTICLE.sub("", x).strip() for x in re.split(r",\s*(?:and\s+)?", m.group(1))] if m else []
        task = f"In household {self._world}: {info['task']}"
        return obs, {**info, "task": task, "world": self._world, "facts": self.episode_facts()}

    def _apply(self, action: str):
        outcome = super()._apply(action)
        recep, items = seen_in(outcome.obs)
        if recep is not None:
            self._here = (recep, items)
            if items is not None:
                if recep not in self._facts["searched"]:
                    self._facts["searched"].append(recep)
                for item in items:
                    self._facts["locations"].setdefault(item.rsplit(" ", 1)[0], recep)
        outcome.info = {**outcome.info, "world": self._world, "facts": self.episode_facts()}
        return outcome

    def episode_facts(self) -> dict[str, Any]:
        """What this episode has seen of the household (a copy)."""
        return {"locations": dict(self._facts.get("locations", {})), "searched": list(self._facts.get("searched", []))}

    def oracle_action(self, memory: dict[str, Any] | None = None) -> str:
        """The planner's next command once it is known where the goal's object is (from ``memory`` or this
        episode); until then, search: open the receptacle here if it is closed, else go to the next
        receptacle not yet searched, in the order the room was described.

        Args:
            memory: ``facts`` remembered from earlier episodes of this household (``None``: a new one).
        """
        facts = merge_facts(memory, self.episode_facts())
        target = self._goal.object_target.lower() if self._goal is not None else ""
        holding = any(c.startswith("move ") for c in self._admissible)
        if holding or target in facts.get("locations", {}):
            return super().oracle_action()
        recep, items = self._here
        if recep is not None and items is None and f"open {recep}" in self._admissible:
            return f"open {recep}"
        searched = set(facts.get("searched", []))
        for r in self._receptacles:
            if r not in searched and r != recep and f"go to {r}" in self._admissible:
                return f"go to {r}"
        return super().oracle_action()  # everything searched (the target was carried off?): plan
