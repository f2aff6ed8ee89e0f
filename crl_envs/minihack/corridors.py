"""MiniHack Corridors: a persistent world where one of K dark corridors goes through.

The level (a des-file written per episode, run on the real NetHack engine through MiniHack):

    -------               -------
    |.....+###### ########|.....|     a lit room on the west with K doorways on its east wall;
    |.....|       ########.....>|     from each a dark corridor runs L cells east, but only one
    |.....+######         |.....|     reaches the (unlit) room with the staircase; the others
    -------               -------     end at its wall.

Which corridor goes through and where the staircase is are the *world's* facts (fixed across
its episodes); the start cell is the *episode's*. See :mod:`crl_envs.persistent` for the seed
encoding and the ``world``/``facts`` info keys.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

from crl_envs.minihack.env import MiniHackTextEnv
from crl_envs.persistent import EPISODES_PER_WORLD, episode_of, merge_facts, world_of

_NLE_ID = "MiniHack-CRL-Corridors-v0"  # the MiniHack class with a placeholder level, replaced at every reset
_ROOM_W = 5  # interior width of each room
_DIRS = {"north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1),
         "northeast": (-1, 1), "southeast": (1, 1), "southwest": (1, -1), "northwest": (-1, -1)}


class Layout:
    """Where everything is in one episode's level, in des-file map coordinates ``(row, col)``."""

    def __init__(self, corridors: int, length: int, through: int, stairs: tuple[int, int], start: tuple[int, int]):
        self.k, self.length, self.through = corridors, length, through
        self.height = 2 * corridors + 1
        self.door_col = _ROOM_W + 1  # the west room's east wall
        self.end_col = self.door_col + length  # the last corridor cell
        self.east_wall = self.end_col + 1
        self.width = self.east_wall + _ROOM_W + 2
        self.stairs, self.start = stairs, start

    def corridor_row(self, i: int) -> int:
        return 2 * i + 1

    def passable(self) -> set[tuple[int, int]]:
        """Every cell one can stand on (the true map: the through corridor reaches the east room)."""
        cells = {(r, c) for r in range(1, self.height - 1) for c in range(1, self.door_col)}
        cells |= {(r, c) for r in range(1, self.height - 1) for c in range(self.east_wall + 1, self.width - 1)}
        for i in range(self.k):
            row = self.corridor_row(i)
            cells |= {(row, c) for c in range(self.door_col, self.end_col + 1)}
        cells.add((self.corridor_row(self.through), self.east_wall))
        return cells

    def des(self) -> str:
        """The MiniHack des-file of this level."""
        grid = [[" "] * self.width for _ in range(self.height)]
        for c0, c1 in ((0, self.door_col), (self.east_wall, self.width - 1)):
            for c in range(c0, c1 + 1):
                grid[0][c] = grid[-1][c] = "-"
            for r in range(1, self.height - 1):
                grid[r][c0] = grid[r][c1] = "|"
                for c in range(c0 + 1, c1):
                    grid[r][c] = "."
        doors = []
        for i in range(self.k):
            row = self.corridor_row(i)
            grid[row][self.door_col] = "+"
            doors.append((self.door_col, row))
            for c in range(self.door_col + 1, self.end_col + 1):
                grid[row][c] = "#"
        row = self.corridor_row(self.through)
        grid[row][self.east_wall] = "+"
        doors.append((self.east_wall, row))
        lines = ['MAZE: "mylevel", \' \'', "FLAGS: noteleport", "GEOMETRY:center,center", "MAP",
                 *("".join(r) for r in grid), "ENDMAP",
                 f"REGION:(0,0,{self.door_col},{self.height - 1}),lit,\"ordinary\"",
                 f"REGION:({self.east_wall},0,{self.width - 1},{self.height - 1}),unlit,\"ordinary\""]
        lines += [f"DOOR:nodoor,({x},{y})" for x, y in doors]
        lines.append(f"STAIR:({self.stairs[1]},{self.stairs[0]}),down")
        lines.append(f"BRANCH:({self.start[1]},{self.start[0]},{self.start[1]},{self.start[0]}),(0,0,0,0)")
        return "\n".join(lines) + "\n"


def make_layout(corridors: int, length: int, world: int, episode: int) -> Layout:
    """The level of ``episode`` in ``world``: the world draws the through corridor and the staircase,
    the episode the start cell in the west room."""
    w_rng = np.random.default_rng([int(world), corridors, length, 0xC0])
    through = int(w_rng.integers(corridors))
    probe = Layout(corridors, length, through, (1, 1), (1, 1))
    stairs = (int(w_rng.integers(1, probe.height - 1)), int(w_rng.integers(probe.east_wall + 2, probe.width - 1)))
    e_rng = np.random.default_rng([int(world), int(episode), corridors, length, 0xE9])
    start = (int(e_rng.integers(1, probe.height - 1)), int(e_rng.integers(1, probe.door_col)))
    return Layout(corridors, length, through, stairs, start)


def _bfs(cells: set[tuple[int, int]], src: tuple[int, int], dst: tuple[int, int], door_col: int,
         east_wall: int) -> str | None:
    """The first move of a shortest path (no diagonal step into or out of a wall's doorway)."""
    if src == dst:
        return None
    def in_room(col: int) -> bool:
        return col < door_col or col > east_wall

    prev: dict[tuple[int, int], tuple[tuple[int, int], str]] = {src: (src, "")}
    queue = deque([src])
    while queue:
        cur = queue.popleft()
        if cur == dst:
            break
        for name, (dr, dc) in _DIRS.items():
            nxt = (cur[0] + dr, cur[1] + dc)
            if nxt not in cells or nxt in prev:
                continue
            if dr and dc and not (in_room(cur[1]) and in_room(nxt[1])):
                continue  # doorways and corridors: orthogonal moves only
            prev[nxt] = (cur, name)
            queue.append(nxt)
    if dst not in prev:
        return None
    cur, move = dst, ""
    while cur != src:
        cur, move = prev[cur]
    return move


class MiniHackCorridorsEnv(MiniHackTextEnv):
    """MiniHack Corridors: K dark corridors lead east, one goes through; the world keeps which.

    ## Description
    A lit room with K doorways on its east wall; behind each a dark corridor of ``length`` cells.
    One corridor reaches an unlit room holding the staircase down; the others end at that room's
    wall. Nothing on the map tells them apart until one walks to a corridor's end. A *world* keeps
    the through corridor and the staircase fixed across its episodes; each episode starts
    elsewhere in the west room. An agent that remembers which corridor went through walks
    straight there; one that does not must try corridors, and each dead end costs about
    ``2 * length`` steps of a tight budget. Runs the real NetHack engine (a des-file per level).

    ## Action Space
    As :class:`~crl_envs.minihack.env.MiniHackTextEnv`: ``north`` ... ``northwest``.

    ## Observation Space
    The MiniHack observation (goal, messages, map, status, position, Objects, legend, actions)
    whose goal line names the world (``Goal: World 1000: reach the staircase ...``, also ``info["task"]``),
    and a line after it, ``Corridors (numbered north to south):``, with what this episode has found
    of each (``unexplored``, ``dead end``, ``goes through``).
    A discovery is also stated as a ``Note:`` sentence in the step that made it.

    ## Starting State
    ``reset(seed=s)`` plays episode ``s % 1000`` of world ``s // 1000``
    (:mod:`crl_envs.persistent`); NetHack is seeded from the seed as in every MiniHack id.

    ## Rewards
    1 on reaching the staircase, else 0.

    ## Episode End
    Terminates on the staircase; truncates at ``max_episode_steps``.

    ## Information
    The MiniHack keys, plus ``world`` (int) and ``facts``: ``{"dead_ends": [corridor numbers],
    "through": corridor number}`` as far as this episode has found them (1-based, north to south).

    ## Arguments
    ``corridors`` (K), ``length`` (cells per corridor), ``objects``, ``render_mode``.

    ## Version History
    * v0: initial version.
    """

    def __init__(self, corridors: int = 3, length: int = 6, objects: bool = True, render_mode: str | None = None):
        if not 2 <= int(corridors) <= 8 or not 2 <= int(length) <= 30:
            raise ValueError(f"corridors must be 2..8 and length 2..30, got {corridors}, {length}")
        self.corridors, self.length = int(corridors), int(length)
        if _NLE_ID not in gym.registry:
            gym.register(_NLE_ID, entry_point="minihack.navigation:MiniHackNavigation",
                         kwargs={"des_file": make_layout(self.corridors, self.length, 0, 0).des()})
        super().__init__(task=_NLE_ID, objects=objects, render_mode=render_mode)
        self._set_goal(0)
        self._reset_seed: int | None = None
        self._world = 0
        self._layout = make_layout(self.corridors, self.length, 0, 0)
        self._offset = (0, 0)
        self._facts: dict[str, Any] = {}
        self._note = ""
        self._des = ""

    def _set_goal(self, world: int) -> None:
        self._goal = (f"World {world}: reach the staircase down (>). Exactly one of the {self.corridors} dark "
                      "corridors leading east from this room goes through to it; the others are dead ends.")
        self._renderer.goal = self._goal

    # ------------------------------------------------------------------ env
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._reset_seed = seed
        return super().reset(seed=seed, options=options)

    def _reset_task(self, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        if self._reset_seed is None:
            world, episode = int(self.np_random.integers(1000)), int(self.np_random.integers(EPISODES_PER_WORLD))
        else:
            world, episode = world_of(self._reset_seed), episode_of(self._reset_seed)
        self._world, self._facts, self._note = world, {"dead_ends": []}, ""
        self._set_goal(world)
        self._layout = make_layout(self.corridors, self.length, world, episode)
        des = self._layout.des()
        if des != self._des:
            self._nle.unwrapped.update(des)
            self._des = des
        _, info = super()._reset_task(options)
        bl = self._obs["blstats"]
        self._offset = (int(bl[1]) - self._layout.start[0], int(bl[0]) - self._layout.start[1])
        return self._render(), {**info, "world": world, "facts": self._public_facts()}

    def _apply(self, action: str):
        outcome = super()._apply(action)
        self._note = ""
        if not outcome.terminated:
            self._discover()
            outcome.obs = self._render()
        else:
            outcome.obs = self._render_end_text(outcome.obs)
        outcome.info = {**outcome.info, "world": self._world, "facts": self._public_facts()}
        return outcome

    # ------------------------------------------------------------- the facts
    def position(self) -> tuple[int, int]:
        """The agent's cell in des-file map coordinates."""
        bl = self._obs["blstats"]
        return int(bl[1]) - self._offset[0], int(bl[0]) - self._offset[1]

    def _discover(self) -> None:
        """A corridor's nature is known once one stands at its end (or in the east room)."""
        r, c = self.position()
        lay = self._layout
        if c >= lay.end_col and "through" not in self._facts:
            if c > lay.end_col or r == lay.corridor_row(lay.through):
                self._facts["through"] = lay.through + 1
                self._note = f"Note: corridor {lay.through + 1} goes through to the east room."
            else:
                i = (r - 1) // 2
                if i + 1 not in self._facts["dead_ends"]:
                    self._facts["dead_ends"].append(i + 1)
                    self._note = f"Note: corridor {i + 1} is a dead end."

    def _public_facts(self) -> dict[str, Any]:
        return {"dead_ends": sorted(self._facts.get("dead_ends", [])),
                **({"through": self._facts["through"]} if "through" in self._facts else {})}

    def _status_lines(self) -> list[str]:
        states = []
        for i in range(1, self.corridors + 1):
            if self._facts.get("through") == i:
                states.append(f"{i} goes through")
            elif i in self._facts.get("dead_ends", []):
                states.append(f"{i} dead end")
            else:
                states.append(f"{i} unexplored")
        lines = ["Corridors (numbered north to south): " + ", ".join(states) + "."]
        return lines + ([self._note] if self._note else [])

    def _render(self) -> str:
        text = super()._render()
        head, _, rest = text.partition("\n")
        return "\n".join([head, *self._status_lines(), rest])

    def _render_end_text(self, text: str) -> str:
        head, _, rest = text.partition("\n")
        return "\n".join([head, *self._status_lines(), rest])

    # ---------------------------------------------------------------- solver
    def oracle_action(self, memory: dict[str, Any] | None = None) -> str:
        """The shortest way to the staircase given what is known; otherwise try the nearest unexplored corridor.

        Args:
            memory: ``facts`` remembered from earlier episodes of this world (``None``: a new world).
        """
        facts = merge_facts(memory, self._public_facts())
        lay = self._layout
        cells = lay.passable()
        me = self.position()
        if "through" in facts:
            target = lay.stairs
        else:
            dead = set(facts.get("dead_ends", []))
            todo = [i for i in range(lay.k) if i + 1 not in dead]
            if not todo:
                todo = list(range(lay.k))
            belief = cells - {(r, c) for r in range(lay.height) for c in range(lay.east_wall, lay.width)}
            ends = {i: (lay.corridor_row(i), lay.end_col) for i in todo}
            dist = {i: self._distance(belief, me, e) for i, e in ends.items()}
            target = ends[min(todo, key=lambda i: (dist[i], i))]
            cells = belief
        move = _bfs(cells, me, target, lay.door_col, lay.east_wall)
        return move or "east"

    def _distance(self, cells: set[tuple[int, int]], src: tuple[int, int], dst: tuple[int, int]) -> int:
        seen, frontier, d = {src}, [src], 0
        while frontier:
            if dst in seen:
                return d
            nxt = []
            for r, c in frontier:
                for dr, dc in _DIRS.values():
                    cell = (r + dr, c + dc)
                    if cell in cells and cell not in seen:
                        seen.add(cell)
                        nxt.append(cell)
            frontier, d = nxt, d + 1
        return 10**6
