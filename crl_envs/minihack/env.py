"""The MiniHack text env: one class, the MiniHack task as a kwarg."""

from __future__ import annotations

import string
import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from crl_envs.core import InvalidAction, StepOutcome, TextEnv
from crl_envs.minihack.render import Renderer, map_box, text_of
from crl_envs.minihack.solver import MiniHackPlanner

_OBS_KEYS = ("glyphs", "chars", "blstats", "message", "screen_descriptions", "inv_strs", "inv_letters", "tty_chars")
_IN_YN, _IN_GETLIN, _XWAITFORSPACE = 1, 2, 3  # indices into NLE's "internal" array (never shown to agents)
_MAX_CONTINUES = 64
_DEATH, _TASK_SUCCESSFUL = 1, 2  # nle's StepStatus
_NAMES = {
    "N": "north", "E": "east", "S": "south", "W": "west",
    "NE": "northeast", "SE": "southeast", "SW": "southwest", "NW": "northwest",
}
_RETURN, _ESC = 13, 27
_GOAL = {
    "Room": "Reach the staircase down (>).",
    "MazeWalk": "Find your way through the maze to the staircase down (>).",
    "KeyRoom": "Pick up the key, unlock the door with it, and reach the staircase down (>).",
}


class MiniHackTextEnv(TextEnv):
    """A MiniHack task (Room, MazeWalk, KeyRoom, ...) played through text.

    ## Description
    Runs the real NetHack engine through ``minihack``. The observation is a text rendering a
    person could play from; actions are named NetHack commands.

    ## Action Space
    ``UnicodeText``: a named action valid in this task (``north``, ``east``, ..., ``northwest``;
    plus ``pickup`` and ``apply`` in KeyRoom), listed in ``info["admissible_actions"]``. When
    NetHack asks a question (e.g. "What do you want to use or apply? [f or ?*]" or "In what
    direction?"), answer with an item letter (``f``, as listed in the inventory), ``y``/``n``,
    or a direction name; ``escape`` cancels the question. Single letters are only accepted
    while a question is pending. Example (KeyRoom): ``apply`` -> ``g`` -> ``west``.
    "--More--" prompts are continued automatically (their messages are kept) and requests
    for typed text are cancelled, so no prompt ever stalls an episode. Anything else is an
    invalid move with feedback.

    ## Observation Space
    ``UnicodeText``: the goal, NetHack's messages since the last action, the map (trimmed to
    the dungeon area), the status lines, your position (row/column within the shown map)
    and HP, the Objects part, a legend of the remaining symbols, the inventory as
    ``letter - item`` (KeyRoom), a pending question if any, and the actions. The Objects
    part lists every shown or remembered door, staircase, trap, item and monster (anything
    but floor, wall and darkness) with NetHack's own description and its exact offset from
    ``@``, nearest first, at most ``MAX_OBJECTS`` (16), e.g. ``Objects: staircase down (>):
    3 south, 2 east; lichen (F): 1 north (adjacent)``; see :mod:`crl_envs.minihack.objects`.
    The legend then describes only the symbols the Objects part does not (floor, walls,
    you). NetHack clears its screen when the game ends, so the last observation gives the
    goal, the messages and the outcome ("You reached the goal." / "You died.").

    ## Starting State
    MiniHack's generated level for the seed. ``reset(seed=...)`` seeds NetHack's core and
    display RNGs from ``self.np_random`` (``env.seed(core, disp, reseed=False)``): plain
    ``reset(seed=...)`` does not seed NetHack.

    ## Rewards
    1 on reaching the goal, else 0 (MiniHack's small step penalties are dropped).

    ## Episode End
    Terminates on success or death; truncates at ``max_episode_steps`` (MiniHack's own limit).

    ## Information
    ``task``, ``admissible_actions``, ``valid_action``, ``success``, ``progress`` (1 on success, else 0).

    ## Arguments
    ``task``: the MiniHack id, e.g. ``"MiniHack-Room-5x5-v0"``; ``objects``: whether to show
    the Objects part (``False`` gives the older observation with a legend of every symbol,
    for ablations); ``render_mode``.

    ## Version History
    * v0: initial version. The Objects part was added later without a version bump, because
      no published result depended on the older text (the committed ``llm`` baselines are rerun).
    """

    fast_steps = True  # NetHack steps take microseconds: in-process pools call it on the event loop

    family = "MiniHack"

    def __init__(self, task: str = "MiniHack-Room-5x5-v0", objects: bool = True, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        try:
            with warnings.catch_warnings():  # minihack imports the deprecated pkg_resources: not the user's concern
                warnings.filterwarnings("ignore", message=".*pkg_resources.*")
                import minihack  # noqa: F401 - registers MiniHack ids
        except ImportError as e:
            raise gym.error.DependencyNotInstalled('MiniHack needs nle and minihack: pip install -e ".[minihack]"') from e
        from nle import nethack

        self.task = task
        probe = gym.make(task)
        base = list(probe.unwrapped.actions)
        probe.close()
        by_value = {int(a): a for a in nethack.ACTIONS}
        letters = [by_value[ord(c)] for c in string.ascii_letters]
        actions = base + [a for a in letters if a not in base] + [by_value[_RETURN], by_value[_ESC]]
        self._nle = gym.make(
            task,
            observation_keys=_OBS_KEYS,
            actions=tuple(actions),
            allow_all_yn_questions=True,  # questions reach the agent
            allow_all_modes=True,  # "--More--" and text prompts reach _continue(), which keeps the messages
            max_episode_steps=10**7,  # our TimeLimit governs, so the limit is a truncation
            disable_env_checker=True,
        )
        self._step = self._nle.unwrapped.step  # the wrappers' TimeLimit of 10**7 never fires
        self._internal = np.zeros(9, np.int32)  # NLE's "internal" buffer, bound at reset
        self._index = {int(a): i for i, a in enumerate(actions)}
        self._named: dict[str, int] = {}
        for a in base:
            name = _NAMES.get(a.name, a.name.lower().replace("_", " "))
            self._named[name] = int(a)
        self._goal = next((g for k, g in _GOAL.items() if f"-{k}" in task), "Reach the staircase down (>).")
        self._actions = tuple(self._named)
        self._actions_in_prompt = (*self._actions, "escape")
        self._renderer = Renderer(self._goal, show_inventory="KeyRoom" in task, show_objects=objects)
        self._obs: dict[str, np.ndarray] = {}
        self._prompt = ""
        self._message = ""
        self._planner = MiniHackPlanner()

    # ------------------------------------------------------------------ env
    def _reset_task(self, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        core, disp = (int(x) for x in self.np_random.integers(1, 2**31 - 1, size=2))
        self._nle.unwrapped.seed(core, disp, reseed=False)
        self._obs, _ = self._nle.reset()
        raw = self._nle.unwrapped  # NLE fills "internal" every step but MiniHack does not return it (nle==1.3.0)
        self._internal = raw.last_observation[raw._internal_index]  # a buffer NLE reuses in place
        self._prompt = ""
        self._planner = MiniHackPlanner()
        self._continue()
        return self._render(), {"task": self._goal}

    def _key(self, key: int) -> tuple[float, bool, dict]:
        self._obs, reward, term, trunc, info = self._step(self._index[key])
        return float(reward), bool(term), info

    def _press(self, key: int) -> tuple[bool, dict]:
        """Send a key that only gets NetHack past a prompt ("--More--", a text prompt) straight to the game.

        This is how NLE's own step answers these prompts (its "known steps"): an env step would
        copy every observation array twice for a key that is no move of the agent's, which made
        each "--More--" cost as much as a move. ``self._obs`` views NLE's buffers, which the game
        updates in place; the end of the episode is judged as NLE's step judges it (nle==1.3.0).

        Returns:
            ``(terminated, info)`` as from an env step.
        """
        raw = self._nle.unwrapped
        observation, done = raw.nethack.step(key)
        status = raw._get_end_status(observation, done)
        if status and not done:
            raw._quit_game(observation, done)
        return bool(status), {"end_status": status}

    def _continue(self, term: bool = False, info: dict | None = None) -> tuple[bool, dict]:
        """Get past "--More--" (keeping each message) and text prompts, so nothing stalls.

        Args:
            term, info: what the last NetHack step returned.

        Returns:
            ``(terminated, info)`` after the extra keys. Sets ``self._message`` to every
            message shown since the last action, and ``self._prompt`` to NetHack's pending
            question, if any.
        """
        info, parts = info or {}, []
        for _ in range(_MAX_CONTINUES):
            internal = self._internal
            if term or not (internal[_XWAITFORSPACE] or internal[_IN_GETLIN]):
                break
            if internal[_XWAITFORSPACE]:
                part = text_of(self._obs["message"])
                if part and (not parts or parts[-1] != part):
                    parts.append(part)
                term, info = self._press(_RETURN)
            else:  # NetHack wants a typed line (e.g. a name); agents only answer single-key questions
                term, info = self._press(_ESC)
        msg = text_of(self._obs["message"])
        # NetHack's own flag, not the message's wording: a message that merely ends in "?" must not let
        # raw letters (S = save, Q = quit, i = inventory) reach the command loop
        self._prompt = (msg or "NetHack asks for one key.") if self._internal[_IN_YN] else ""
        if parts and parts[-1] != msg:
            parts.append(msg)
        self._message = "  ".join(p for p in parts if p) if parts else msg
        return term, info

    def normalize_action(self, action: str) -> str:
        a = " ".join(action.split())
        return a if len(a) == 1 else a.lower()

    def _apply(self, action: str) -> StepOutcome:
        if action in self._named:
            key = self._named[action]
        elif action == "escape":
            key = _ESC
        elif len(action) == 1 and action in string.ascii_letters:
            if not self._prompt:
                raise InvalidAction(f"{action!r} answers a question, but NetHack is not asking one")
            key = ord(action)
        else:
            raise InvalidAction(f"{action[:60]!r} is not an action here; use one of: {', '.join(self._named)}")
        term, info = self._continue(*self._key(key)[1:])
        if not term:
            return StepOutcome(obs=self._render())
        status = int(info.get("end_status", 0))
        success = status == _TASK_SUCCESSFUL
        return StepOutcome(obs=self._render_end(status), reward=float(success), terminated=True, success=success,
                           progress=float(success))

    def _admissible_actions(self) -> list[str]:
        return list(self._actions_in_prompt if self._prompt else self._actions)

    def oracle_action(self) -> str:
        return self._planner.act(self._obs, self._prompt)

    # ------------------------------------------------------------ rendering
    def map_lines(self) -> tuple[list[str], int, int]:
        """The dungeon map trimmed to its bounding box, with the box's top-left (row, col)."""
        return map_box(self._obs["chars"])

    def _render_end(self, status: int) -> str:
        """The last observation: NetHack has ended the game, so there is no map left to show."""
        outcome = {_TASK_SUCCESSFUL: "You reached the goal.", _DEATH: "You died."}.get(status, "The game ended.")
        return f"Goal: {self._goal}\nMessage: {self._message or '(none)'}\nThe episode is over. {outcome}"

    def _render(self) -> str:
        actions = self._actions_in_prompt if self._prompt else self._actions
        return self._renderer.render(self._obs, self._message, self._prompt, actions)

    def close(self) -> None:
        if getattr(self, "_nle", None) is not None:
            self._nle.close()
            self._nle = None
        super().close()
