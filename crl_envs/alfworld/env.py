"""The ALFWorld text env: generated or official games on TextWorld's PDDL engine."""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

from crl_envs.alfworld.generator import GENERATOR_VERSION, TASK_TYPES
from crl_envs.core import InvalidAction, StepOutcome, TextEnv

ALFWORLD_VERSION = "0.4.2"
TASK_ALIASES = {"PickPlace": "pick_and_place_simple", "Look": "look_at_obj_in_light",
                "PickClean": "pick_clean_then_place_in_recep", "PickHeat": "pick_heat_then_place_in_recep",
                "PickCool": "pick_cool_then_place_in_recep", "PickTwo": "pick_two_obj_and_place"}
_PUT = re.compile(r"^put (.+?) (?:in/on|into|onto|in|on|to) (.+)$")
_NEUTRAL = re.compile(r"^(look|inventory|help|examine .+)$")
_WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
_TASK = re.compile(r"Your task is to: (.+)")
_TREATED = {"pick_clean_then_place_in_recep": "isclean", "pick_heat_then_place_in_recep": "ishot",
            "pick_cool_then_place_in_recep": "iscool"}


def _import_backend() -> None:
    try:
        import alfworld  # noqa: F401
        import textworld  # noqa: F401
    except ImportError as e:
        from gymnasium.error import DependencyNotInstalled

        raise DependencyNotInstalled(f'ALFWorld needs alfworld=={ALFWORLD_VERSION} and textworld: '
                                     f'pip install -e ".[alfworld]" ({e})') from e
    from importlib.metadata import version

    if version("alfworld") != ALFWORLD_VERSION:
        warnings.warn(f"crl-bench's ALFWorld envs are pinned to alfworld=={ALFWORLD_VERSION} (its PDDL domain, "
                      f"grammar and 'move X to Y' spelling); found {version('alfworld')}", stacklevel=3)


class ALFWorldEnv(TextEnv):
    """Household tasks in text: ALFWorld's six task types on TextWorld's PDDL engine.

    ## Description
    ALFWorld (Shridhar et al., 2021) played exactly as alfworld's ``AlfredTWEnv`` plays it:
    ``game.tw-pddl`` files in ``textworld.gym`` with alfworld's ``AlfredDemangler`` and
    ``AlfredInfos``, the PDDL domain and grammar of ``alfworld==0.4.2`` (pinned). Games are either
    *generated* (a seeded scene on one of the 120 real AI2-THOR floor plans the wheel ships,
    with distractors and closed receptacles, verified winnable and cached on disk; see
    :mod:`crl_envs.alfworld.games`) or the *official* ones under ``$ALFWORLD_DATA``.

    ## Action Space
    ``UnicodeText``: one of ``info["admissible_actions"]``, e.g. ``go to countertop 1``,
    ``open fridge 1``, ``take apple 1 from countertop 1``, ``move apple 1 to fridge 1``,
    ``heat apple 1 with microwave 1``, ``clean``/``cool ... with ...``, ``use desklamp 1``,
    ``examine ...``, ``look``, ``inventory``. Case, extra spaces and a final period are ignored.
    **Since alfworld 0.4, ``put X in/on Y`` is spelled ``move X to Y``**; the old spelling (``put X
    in Y``, ``put X on Y``, ``put X in/on Y``) is accepted as an alias. Any other text is an invalid
    move: the engine's "Nothing happens." with a hint, reward 0, state unchanged.

    ## Observation Space
    ``UnicodeText``: the engine's feedback. The first observation describes the room and ends
    with "Your task is to: ...".

    ## Starting State
    The game for the seed. Generated ids: ``seed`` draws the task type (``crl/ALFWorld-v0`` mixes
    the six uniformly) and a game seed; the game is generated on first use and cached. Official
    ids: reset seed ``i`` plays game ``i mod n`` in sorted path order (seeds 0..n-1 cover the split
    once); without a seed a game is drawn from ``np_random``. ``options={"game_file": path}`` plays a
    given ``game.tw-pddl``.

    ## Rewards
    1 on the step that wins the game, else 0 (ALFWorld's score).

    ## Episode End
    Terminates when the game is won. Truncates after ``max_episode_steps`` = 50 steps, ALFWorld's
    standard budget in ReAct, Reflexion, AgentBench and the Complementary RL paper (alfworld's own
    training configs use 50 too). Invalid moves count as steps.

    ## Information
    ``task`` (the goal text), ``admissible_actions`` (TextWorld's ``admissible_commands``),
    ``valid_action``, ``success`` (the game is won), ``progress``: the fraction of the goal's
    sub-conditions reached, the best so far in the episode: holding a target object; for clean/
    heat/cool, the object treated; for pick-two, each object placed; for look-at-in-light, the
    lamp on; 1 when won. Also ``task_type`` and ``game_file``.

    ## Arguments
    ``task_type`` (``"all"`` or one of the six ALFWorld names), ``source`` (``"generated"`` or
    ``"official"``), ``split`` (official: ``train``, ``valid_seen``, ``valid_unseen``), ``data_path``
    (official: instead of ``$ALFWORLD_DATA``), ``num_games`` (generated: draw game seeds from
    ``range(num_games)``, a fixed training pool; default unbounded), ``render_mode``.

    ## Version History
    * v0: initial version (alfworld 0.4.2, generator version 1).
    """

    family = "ALFWorld"

    def __init__(self, task_type: str = "all", source: str = "generated", split: str = "valid_unseen",
                 data_path: str | None = None, num_games: int | None = None, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        task_type = TASK_ALIASES.get(task_type, task_type)
        if task_type != "all" and task_type not in TASK_TYPES:
            raise ValueError(f"unknown ALFWorld task_type {task_type!r}; use 'all' or one of {', '.join(TASK_TYPES)}")
        if source not in ("generated", "official"):
            raise ValueError(f"source must be 'generated' or 'official', not {source!r}")
        if num_games is not None and int(num_games) < 1:
            raise ValueError("num_games must be a positive number of games (or None for unbounded)")
        _import_backend()
        self.task_types = TASK_TYPES if task_type == "all" else (task_type,)
        self.source, self.split, self.data_path = source, split, data_path
        self.num_games = None if num_games is None else int(num_games)
        self._games: tuple[str, ...] = ()
        if source == "official":
            from crl_envs.alfworld.official import official_games

            self._games = official_games(split, data_path, self.task_types)  # fails early, with instructions
        self._player = None
        self._reset_seed: int | None = None
        self._admissible: list[str] = []
        self._goal = None
        self._task_type = ""
        self._game_file = ""
        self._plan: list[str] = []
        self._plan_pos = 0
        self._on_plan = False
        self._progress_best = 0.0
        self._types: tuple[dict[str, str], dict[str, str]] | None = None

    # ------------------------------------------------------------------ env
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._reset_seed = seed
        return super().reset(seed=seed, options=options)

    def _pick_game(self, options: dict[str, Any] | None) -> str:
        from crl_envs.alfworld.games import get_game

        if options and options.get("game_file"):
            path = os.path.abspath(str(options["game_file"]))
            if not os.path.isfile(path):
                raise FileNotFoundError(f"options['game_file']: no game at {path}; pass a game.tw-pddl file")
            return path
        if self.source == "official":
            n = len(self._games)
            i = self._reset_seed % n if self._reset_seed is not None else int(self.np_random.integers(n))
            return self._games[i]
        task_type = self.task_types[int(self.np_random.integers(len(self.task_types)))]
        game_seed = int(self.np_random.integers(self.num_games or 2**31 - 1))
        return get_game(task_type, game_seed, player=self._ensure_player())

    def _ensure_player(self):
        if self._player is None:
            from crl_envs.alfworld.engine import Player

            self._player = Player()
        return self._player

    def _reset_task(self, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        from crl_envs.alfworld.official import game_params
        from crl_envs.alfworld.solver import Goal

        game_file = self._pick_game(options)
        obs, infos = self._ensure_player().load(game_file)
        self._game_file = game_file
        self._task_type, params = game_params(game_file)
        self._goal = Goal.from_params(self._task_type, params) if params.get("object_target") else None
        self._admissible = list(infos["admissible_commands"])
        self._plan, self._plan_pos, self._on_plan = self._stored_plan(), 0, True
        obs = obs.replace(_WELCOME, "").strip()
        m = _TASK.search(obs)
        task = m.group(1).strip() if m else "Solve the household task."
        self._progress_best = 0.0
        self._types = None
        return obs, {"task": task, "task_type": self._task_type, "game_file": game_file,
                     "generator_version": GENERATOR_VERSION, "alfworld_version": ALFWORLD_VERSION}

    def _stored_plan(self) -> list[str]:
        from crl_envs.alfworld.games import read_game

        try:
            walkthrough = read_game(self._game_file).get("walkthrough") or []
        except ValueError:
            return []
        return [self.canonical(c) for c in walkthrough if isinstance(c, str)]

    def normalize_action(self, action: str) -> str:
        return " ".join(action.lower().split()).rstrip(".").strip()

    def canonical(self, command: str) -> str:
        """A normalised command with the pre-0.4 ``put X in/on Y`` spelling mapped to ``move X to Y``."""
        command = self.normalize_action(command)
        m = _PUT.match(command)
        if m and command not in self._admissible:
            return f"move {m.group(1)} to {m.group(2)}"
        return command

    def _apply(self, action: str) -> StepOutcome:
        command = self.canonical(action)
        if command not in self._admissible:
            raise InvalidAction(f"Nothing happens. {action[:80]!r} is not a command you can use here; "
                                "pick one of info['admissible_actions'] (e.g. 'go to ...', 'take X from Y', "
                                "'move X to Y', 'open X', 'examine X', 'look').")
        obs, _, _, infos = self._player.step(command)
        self._admissible = list(infos["admissible_commands"])
        self._track_plan(command)
        won = bool(infos["won"])
        progress = 1.0 if won else self._goal_progress()
        self._progress_best = max(self._progress_best, progress)
        return StepOutcome(obs, reward=1.0 if won else 0.0, terminated=won, success=won, progress=self._progress_best,
                           info={"task_type": self._task_type, "game_file": self._game_file})

    def _admissible_actions(self) -> list[str]:
        return list(self._admissible)

    def _goal_progress(self) -> float:
        """Fraction of the goal's sub-conditions that hold now (0 when the goal is unknown)."""
        from crl_envs.alfworld.solver import DYNAMIC, read_state

        g = self._goal
        if g is None:
            return 0.0
        if self._types is None:  # object and receptacle types never change: read them once per game
            full = read_state(self._player.pddl_env)
            self._types = (full.otype, full.rtype)
        s = read_state(self._player.pddl_env, DYNAMIC)
        s.otype, s.rtype = self._types
        obj_t = g.object_target.lower() + "type"
        holding = s.holding is not None and s.otype.get(s.holding) == obj_t
        if g.task_type == "look_at_obj_in_light":
            lamp_t = g.toggle_target.lower() + "type"
            lamp_on = any(s.otype.get(o) == lamp_t for o in s.flags["istoggled"])
            return (holding + lamp_on) / 3
        recep_t = g.parent_target.lower() + "type"
        if g.task_type == "pick_two_obj_and_place":
            counts: dict[str, int] = {}
            for o, r in s.in_recep.items():
                if s.otype.get(o) == obj_t and s.rtype.get(r) == recep_t:
                    counts[r] = counts.get(r, 0) + 1
            placed = min(max(counts.values(), default=0), 2)
            return (2 * placed + holding) / 4
        if g.task_type in _TREATED:
            treated = s.holding is not None and holding and s.holding in s.flags[_TREATED[g.task_type]]
            return (holding + treated) / 3
        return holding / 2

    # --------------------------------------------------------------- oracle
    def _track_plan(self, command: str) -> None:
        if self._on_plan and self._plan_pos < len(self._plan) and command == self._plan[self._plan_pos]:
            self._plan_pos += 1
        elif not _NEUTRAL.match(command):
            self._on_plan = False

    def oracle_action(self) -> str:
        """The next command of the stored plan; after a deviation, a fresh plan from the current facts."""
        if self._on_plan and self._plan_pos < len(self._plan) and self._plan[self._plan_pos] in self._admissible:
            return self._plan[self._plan_pos]
        plan = None
        if self._goal is not None:
            from crl_envs.alfworld.solver import plan_from_engine

            plan = plan_from_engine(self._player.pddl_env, self._goal)
        if plan is None:
            plan = self._player.replan()  # Fast Downward, once: slow on big scenes, but exact
        self._plan, self._plan_pos, self._on_plan = list(plan), 0, True
        if plan and plan[0] in self._admissible:
            return plan[0]
        return "look"

    def close(self) -> None:
        if self._player is not None:
            self._player.close()
            self._player = None
        super().close()
