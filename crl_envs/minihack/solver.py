"""A planner for MiniHack on the visible map (drives ``--agent oracle``).

It BFSes (8 directions, no diagonal steps through doorways) to the staircase down when it
is visible, explores the nearest unvisited frontier when it is not (Dark rooms, mazes),
and in KeyRoom picks up the key, walks next to the locked door, applies the key toward it,
opens it and goes on. Monsters are walked into, which attacks them.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

DIRS = {
    "north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1),
    "northeast": (-1, 1), "southeast": (1, 1), "southwest": (1, -1), "northwest": (-1, -1),
}
_BLOCKING = {ord(" "), ord("-"), ord("|"), ord("+")}


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

    def _passable(self, obs, r: int, c: int) -> bool:
        ch = int(obs["chars"][r, c])
        if ch in (ord("-"), ord("|")):
            return "open door" in _desc(obs, r, c) or "doorway" in _desc(obs, r, c)
        return ch not in _BLOCKING

    def _is_door(self, obs, r: int, c: int) -> bool:
        return (r, c) in self.doors

    def _remember_doors(self, obs) -> None:
        chars = obs["chars"]
        for r, c in zip(*np.nonzero(np.isin(chars, (ord("-"), ord("|"), ord("+"), ord(".")))), strict=True):
            if "door" in _desc(obs, int(r), int(c)):
                self.doors.add((int(r), int(c)))

    def _bfs(self, obs, start, goals: set[tuple[int, int]]) -> str | None:
        """First move of a shortest path from ``start`` to any of ``goals``."""
        if not goals:
            return None
        h, w = obs["chars"].shape
        first: dict[tuple[int, int], str | None] = {start: None}
        q = deque([start])
        while q:
            cell = q.popleft()
            if cell in goals and cell != start:
                return first[cell]
            r, c = cell
            for name, (dr, dc) in DIRS.items():
                n = (r + dr, c + dc)
                if not (0 <= n[0] < h and 0 <= n[1] < w) or n in first:
                    continue
                if not (self._passable(obs, *n) or n in goals):
                    continue
                if dr and dc and (self._is_door(obs, r, c) or self._is_door(obs, *n)):
                    continue  # NetHack forbids diagonal moves into or out of doorways
                first[n] = first[cell] or name
                q.append(n)
        return None

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
        stairs = {(int(r), int(c)) for r, c in zip(*np.nonzero(chars == ord(">")), strict=True)}
        if stairs:
            move = self._bfs(obs, me, stairs)
            if move:
                return move
        keys = {(int(r), int(c)) for r, c in zip(*np.nonzero(chars == ord("(")), strict=True)
                if "key" in _desc(obs, int(r), int(c))}
        if key_letter is None:
            msg = bytes(obs["message"]).split(b"\x00", 1)[0].decode("latin-1").lower()
            if "key" in msg and ("you see here" in msg or "there is" in msg):
                return "pickup"
            move = self._bfs(obs, me, keys)
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
            move = self._bfs(obs, me, doors)
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
        move = self._bfs(obs, me, frontier)
        return move or "north"
