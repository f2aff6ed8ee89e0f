"""A planner for MiniHack on the visible map (drives ``--agent oracle``).

It BFSes (8 directions, no diagonal steps through doorways) to the staircase down when it
is visible, explores the nearest unvisited frontier when it is not (Dark rooms, mazes),
and in KeyRoom picks up the key, walks next to the locked door, applies the key toward it,
opens it and goes on.

Hazards: paths keep off known traps (``^``), monsters and the cells next to hostile
monsters when they can (then off traps and monsters only, then anything). A hostile monster
next to us is attacked (walking into it) unless the staircase is within a step or two:
in NetHack a monster as fast as we are gets free hits on a fleeing player, so fighting
first costs fewer hit points than walking on. Peaceful monsters are never attacked.
"""

from __future__ import annotations

import string
from collections import deque
from typing import Any

import numpy as np

DIRS = {
    "north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1),
    "northeast": (-1, 1), "southeast": (1, 1), "southwest": (1, -1), "northwest": (-1, -1),
}
_BLOCKING = {ord(" "), ord("-"), ord("|"), ord("+")}
_MONSTER_CHARS = frozenset(ord(c) for c in string.ascii_letters + "@&':;") - {ord("I")}  # "I": remembered, unseen
_TRAP = ord("^")
_GOAL_RUSH = 2  # walk on to a staircase this close even with a monster next to us


def _desc(obs: dict[str, np.ndarray], r: int, c: int) -> str:
    return bytes(obs["screen_descriptions"][r, c]).split(b"\x00", 1)[0].decode("latin-1")


class MiniHackPlanner:
    """Per-episode planner state (visited cells, the key-apply sequence)."""

    def __init__(self) -> None:
        self.visited: set[tuple[int, int]] = set()
        self.unlocked: set[tuple[int, int]] = set()
        self.pending_door: tuple[int, int] | None = None
        self.pending_dir: str | None = None
        self.doors: set[tuple[int, int]] = set()  # remembered, since the @ hides the door we stand in
        self.avoid: list[set[tuple[int, int]]] = []  # cells to keep off, most cautious first (this step)

    def _passable(self, obs, r: int, c: int) -> bool:
        ch = int(obs["chars"][r, c])
        if ch in (ord("-"), ord("|")):
            return "open door" in _desc(obs, r, c) or "doorway" in _desc(obs, r, c)
        return ch not in _BLOCKING

    def _hazards(self, obs, me) -> dict[tuple[int, int], bool]:
        """Visible traps and other monsters: cell -> whether it is a monster we may attack."""
        chars = obs["chars"]
        out: dict[tuple[int, int], bool] = {}
        for r, c in zip(*np.nonzero(np.isin(chars, list(_MONSTER_CHARS | {_TRAP}))), strict=True):
            cell = (int(r), int(c))
            if cell == me:
                continue
            if int(chars[cell]) == _TRAP:
                out[cell] = False
            else:
                out[cell] = "peaceful" not in _desc(obs, *cell)
        return out

    def _step_allowed(self, obs, frm: tuple[int, int], to: tuple[int, int]) -> bool:
        diagonal = frm[0] != to[0] and frm[1] != to[1]
        return not (diagonal and (self._is_door(obs, *frm) or self._is_door(obs, *to)))

    def _path(self, obs, start, goals: set[tuple[int, int]]) -> tuple[str | None, int]:
        """First move and length of a shortest path, around hazards when possible."""
        for avoid in (*self.avoid, set()):
            move, dist = self._bfs(obs, start, goals, avoid)
            if move:
                return move, dist
        return None, 0

    def _is_door(self, obs, r: int, c: int) -> bool:
        return (r, c) in self.doors

    def _remember_doors(self, obs) -> None:
        chars = obs["chars"]
        for r, c in zip(*np.nonzero(np.isin(chars, (ord("-"), ord("|"), ord("+"), ord(".")))), strict=True):
            if "door" in _desc(obs, int(r), int(c)):
                self.doors.add((int(r), int(c)))

    def _bfs(self, obs, start, goals: set[tuple[int, int]], avoid: set[tuple[int, int]]) -> tuple[str | None, int]:
        """First move and length of a shortest path from ``start`` to any of ``goals``."""
        if not goals:
            return None, 0
        h, w = obs["chars"].shape
        first: dict[tuple[int, int], tuple[str | None, int]] = {start: (None, 0)}
        q = deque([start])
        while q:
            cell = q.popleft()
            if cell in goals and cell != start:
                return first[cell]
            r, c = cell
            move, dist = first[cell]
            for name, (dr, dc) in DIRS.items():
                n = (r + dr, c + dc)
                if not (0 <= n[0] < h and 0 <= n[1] < w) or n in first:
                    continue
                if n not in goals and (n in avoid or not self._passable(obs, *n)):
                    continue
                if not self._step_allowed(obs, cell, n):
                    continue  # NetHack forbids diagonal moves into or out of doorways
                first[n] = (move or name, dist + 1)
                q.append(n)
        return None, 0

    def act(self, obs: dict[str, Any], prompt: str) -> str:
        chars = obs["chars"]
        bl = obs["blstats"]
        me = (int(bl[1]), int(bl[0]))
        self.visited.add(me)
        self._remember_doors(obs)
        inv = [bytes(s).split(b"\x00", 1)[0].decode("latin-1") for s in obs["inv_strs"]]
        letters = [chr(int(x)) for x in obs["inv_letters"]]
        key_letter = next((letters[i] for i, s in enumerate(inv) if "key" in s and "monkey" not in s), None)
        if prompt:
            if "apply" in prompt and key_letter:
                return key_letter
            if "direction" in prompt:
                return self.pending_dir or "escape"
            if "nlock it" in prompt:
                if self.pending_door is not None:
                    self.unlocked.add(self.pending_door)
                return "y"
            return "escape"
        hazards = self._hazards(obs, me)
        near = {(r + dr, c + dc) for (r, c), hostile in hazards.items() if hostile for dr, dc in DIRS.values()}
        self.avoid = [set(hazards) | near, set(hazards)]
        stairs = {(int(r), int(c)) for r, c in zip(*np.nonzero(chars == ord(">")), strict=True)}
        goal_move, goal_dist = self._path(obs, me, stairs)
        if goal_move and goal_dist <= _GOAL_RUSH:
            return goal_move
        for name, (dr, dc) in DIRS.items():
            cell = (me[0] + dr, me[1] + dc)
            if hazards.get(cell) and self._step_allowed(obs, me, cell):
                return name  # attack
        if goal_move:
            return goal_move
        keys = {(int(r), int(c)) for r, c in zip(*np.nonzero(chars == ord("(")), strict=True)
                if "key" in _desc(obs, int(r), int(c))}
        if key_letter is None:
            msg = bytes(obs["message"]).split(b"\x00", 1)[0].decode("latin-1").lower()
            if "key" in msg and ("you see here" in msg or "there is" in msg):
                return "pickup"
            move, _ = self._path(obs, me, keys)
            if move:
                return move
        else:
            door = self._adjacent_door(obs, me)
            if door:
                if door[1] in self.unlocked:
                    return door[0]
                self.pending_dir, self.pending_door = door
                return "apply"
            doors = {(int(r), int(c)) for r, c in zip(*np.nonzero(chars == ord("+")), strict=True)
                     if "door" in _desc(obs, int(r), int(c))}
            move, _ = self._path(obs, me, doors)
            if move:
                return move
        return self._explore(obs, me)

    def _adjacent_door(self, obs, me) -> tuple[str, tuple[int, int]] | None:
        """(direction, cell) of a closed door orthogonally next to us."""
        for name in ("north", "south", "west", "east"):
            dr, dc = DIRS[name]
            r, c = me[0] + dr, me[1] + dc
            if int(obs["chars"][r, c]) == ord("+") and "door" in _desc(obs, r, c):
                return name, (r, c)
        return None

    def _explore(self, obs, me) -> str:
        chars = obs["chars"]
        h, w = chars.shape
        frontier = set()
        for r, c in zip(*np.nonzero(chars != ord(" ")), strict=True):
            r, c = int(r), int(c)
            if (r, c) in self.visited or not self._passable(obs, r, c):
                continue
            if any(0 <= r + dr < h and 0 <= c + dc < w and chars[r + dr, c + dc] == ord(" ")
                   for dr, dc in DIRS.values()):
                frontier.add((r, c))
        move, _ = self._path(obs, me, frontier)
        return move or "north"
