"""The MiniHack text env: one class, the MiniHack task as a kwarg."""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
import numpy as np

from crl_envs.core import InvalidAction, StepOutcome, TextEnv
from crl_envs.minihack.solver import MiniHackPlanner

_OBS_KEYS = ("chars", "blstats", "message", "screen_descriptions", "inv_strs", "inv_letters", "tty_chars")
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


def _text(arr: np.ndarray) -> str:
    return bytes(arr).split(b"\x00", 1)[0].decode("latin-1").strip()


class MiniHackTextEnv(TextEnv):
    """A MiniHack task (Room, MazeWalk, KeyRoom, ...) played through text.

    ## Description
    Runs the real NetHack engine through ``minihack``. The observation is a text rendering a
    person could play from; actions are named NetHack commands.

    ## Action Space
    ``UnicodeText``: a named action valid in this task (``north``, ``east``, ..., ``northwest``;
    plus ``pickup`` and ``apply`` in KeyRoom), listed in ``info["admissible_actions"]``. When
    NetHack asks a question (e.g. "What do you want to use or apply? [f or ?*]" or "In what
    direction?"), answer with an item letter (``f``), ``y``/``n``, or a direction name;
    ``escape`` cancels the question. "--More--" prompts are continued automatically. Anything
    else is an invalid move with feedback.

    ## Observation Space
    ``UnicodeText``: the goal, NetHack's message, the map (trimmed to the dungeon area), the
    status lines, your position and HP, a legend of the symbols on screen (from NetHack's own
    screen descriptions), the inventory (KeyRoom), and a pending question if any.

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
    ``task``: the MiniHack id, e.g. ``"MiniHack-Room-5x5-v0"``; ``render_mode``.

    ## Version History
    * v0: initial version.
    """

    family = "MiniHack"

    def __init__(self, task: str = "MiniHack-Room-5x5-v0", render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        try:
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
            allow_all_yn_questions=True,
            max_episode_steps=10**7,  # our TimeLimit governs, so the limit is a truncation
            disable_env_checker=True,
        )
        self._index = {int(a): i for i, a in enumerate(actions)}
        self._named: dict[str, int] = {}
        for a in base:
            name = _NAMES.get(a.name, a.name.lower().replace("_", " "))
            self._named[name] = int(a)
        self._goal = next((g for k, g in _GOAL.items() if f"-{k}" in task), "Reach the staircase down (>).")
        self._obs: dict[str, np.ndarray] = {}
        self._prompt = ""
        self._planner = MiniHackPlanner()

    # ------------------------------------------------------------------ env
    def _reset_task(self, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        core, disp = (int(x) for x in self.np_random.integers(1, 2**31 - 1, size=2))
        self._nle.unwrapped.seed(core, disp, reseed=False)
        self._obs, _ = self._nle.reset()
        self._prompt = ""
        self._planner = MiniHackPlanner()
        self._continue_more()
        return self._render(), {"task": self._goal}

    def _key(self, key: int) -> tuple[float, bool, dict]:
        self._obs, reward, term, trunc, info = self._nle.step(self._index[key])
        return float(reward), bool(term), info

    def _continue_more(self) -> tuple[bool, dict]:
        term, info = False, {}
        for _ in range(10):  # "--More--" never stalls an episode
            tty = b"".join(bytes(r) for r in self._obs["tty_chars"][:3])
            if b"--More--" not in tty or term:
                break
            _, term, info = self._key(_RETURN)
        msg = _text(self._obs["message"])
        self._prompt = msg if (msg.endswith("?") or msg.endswith("]") or "[yn" in msg) else ""
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
        _, term, info = self._key(key)
        if not term:
            term2, info2 = self._continue_more()
            term, info = term or term2, info2 or info
        status = info.get("end_status")
        success = bool(term and status is not None and int(status) == 2)  # StepStatus.TASK_SUCCESSFUL
        return StepOutcome(self._render(), 1.0 if success else 0.0, term, success, 1.0 if success else 0.0)

    def _admissible_actions(self) -> list[str]:
        return list(self._named) + (["escape"] if self._prompt else [])

    def oracle_action(self) -> str:
        return self._planner.act(self._obs, self._prompt)

    # ------------------------------------------------------------ rendering
    def map_lines(self) -> tuple[list[str], int, int]:
        """The dungeon map trimmed to its bounding box, with the box's top-left (row, col)."""
        chars = self._obs["chars"]
        rows = np.nonzero((chars != 32).any(axis=1))[0]
        cols = np.nonzero((chars != 32).any(axis=0))[0]
        if len(rows) == 0:
            return [], 0, 0
        r0, r1, c0, c1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
        return [bytes(r).decode("latin-1") for r in chars[r0:r1, c0:c1]], int(r0), int(c0)

    def _legend(self) -> str:
        """One NetHack screen description per distinct symbol on the map (vectorised)."""
        chars = self._obs["chars"]
        uniq, first = np.unique(chars.ravel(), return_index=True)
        keep = uniq != 32
        descs = self._obs["screen_descriptions"].reshape(chars.size, -1)
        parts = []
        for ch, i in zip(uniq[keep], first[keep], strict=True):
            d = _text(descs[i])
            parts.append(f"{chr(ch)} {d}" if d else chr(ch))
        return "; ".join(parts)

    def _render(self) -> str:
        lines, r0, c0 = self.map_lines()
        bl = self._obs["blstats"]
        x, y, hp, max_hp = int(bl[0]), int(bl[1]), int(bl[10]), int(bl[11])
        tty = self._obs["tty_chars"]
        status = "\n".join(bytes(r).decode("latin-1").rstrip() for r in tty[22:24])
        out = [
            f"Goal: {self._goal}",
            f"Message: {_text(self._obs['message']) or '(none)'}",
            "Map:",
            *lines,
            status,
            f"You (@) are at row {y - r0}, column {x - c0} of the map. HP {hp}/{max_hp}.",
            f"Legend: {self._legend()}",
        ]
        if "KeyRoom" in self.task:
            strs = self._obs["inv_strs"]
            inv = [_text(strs[i]) for i in np.flatnonzero(strs[:, 0])]
            out.append("Inventory: " + ("; ".join(inv) if inv else "(empty)"))
        if self._prompt:
            out.append(f"NetHack asks: {self._prompt} (answer with a letter, a direction, or escape)")
        out.append("Actions: " + ", ".join(self._admissible_actions()))
        return "\n".join(out)

    def close(self) -> None:
        if getattr(self, "_nle", None) is not None:
            self._nle.close()
            self._nle = None
        super().close()
