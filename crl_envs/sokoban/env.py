"""The Sokoban text env."""

from __future__ import annotations

from typing import Any

from crl_envs.core import InvalidAction, StepOutcome, TextEnv
from crl_envs.sokoban.generator import GENERATOR_VERSION, Level, level_for_seed
from crl_envs.sokoban.solver import MOVES, apply_move, deltas, solve

LEGEND = "Legend: # wall, _ floor, . target, $ box, * box on a target, @ you, + you on a target"
_ALIASES = {"u": "up", "d": "down", "l": "left", "r": "right", "north": "up", "south": "down", "west": "left", "east": "right"}


class SokobanEnv(TextEnv):
    """Push every box onto a target in a small warehouse.

    ## Description
    Classic Sokoban on a ``size`` x ``size`` grid with ``num_boxes`` boxes. Levels come from
    a seeded reverse-play generator and every level is verified solvable by a BFS solver,
    which also drives ``--agent oracle``.

    ## Action Space
    ``UnicodeText``: one of ``up``, ``down``, ``left``, ``right`` (case and surrounding
    whitespace are ignored; ``u``/``d``/``l``/``r`` and ``north``/``south``/``west``/``east`` are
    aliases). Moving into a box pushes it if the cell behind it is free. Anything else is an
    invalid move: reward 0, feedback in the observation, state unchanged.

    ## Observation Space
    ``UnicodeText``: the goal, the grid (``#`` wall, ``_`` floor, ``.`` target, ``$`` box, ``*`` box
    on a target, ``@`` you, ``+`` you on a target), the legend, the number of boxes on targets,
    and what the last move did (e.g. "You bump into a wall.").

    ## Starting State
    The generated level for the seed: boxes off their targets, the player somewhere free.

    ## Rewards
    +1 on the step that puts the last box on a target, 0 otherwise.

    ## Episode End
    Terminates when every box is on a target; truncates at ``max_episode_steps`` (100).
    Boxes pushed into corners can make a level unsolvable; the episode then runs to truncation.

    ## Information
    ``task``, ``admissible_actions`` (the four moves), ``valid_action``, ``success`` and
    ``progress`` = boxes on targets / boxes.

    ## Arguments
    ``size`` (default 6), ``num_boxes`` (default 2), ``render_mode`` (``"ansi"`` or ``None``).

    ## Version History
    * v0: initial version (generator version 1).
    """

    fast_steps = True  # microsecond-to-millisecond steps: in-process pools call it on the event loop

    family = "Sokoban"

    def __init__(self, size: int = 6, num_boxes: int = 2, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        self.size = int(size)
        self.num_boxes = int(num_boxes)
        self._deltas = deltas(self.size)
        self._level: Level | None = None
        self._walls: tuple[bool, ...] = ()
        self._targets: frozenset[int] = frozenset()
        self._boxes: set[int] = set()
        self._player = 0
        self._static: list[str] = []
        self._plan: list[str] = []
        self._plan_key: tuple | None = None
        self._task_text = f"Push all {self.num_boxes} boxes onto the targets."

    # ------------------------------------------------------------------ env
    def _reset_task(self, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        level_seed = int(self.np_random.integers(2**63 - 1))
        self._level = level = level_for_seed(self.size, self.num_boxes, level_seed)
        self._walls, self._targets = level.walls, level.targets
        self._boxes, self._player = set(level.boxes), level.player
        self._static = ["#" if w else "_" for w in level.walls]
        for t in level.targets:
            self._static[t] = "."
        self._plan, self._plan_key = [], None
        info = {"task": self._task_text, "level_seed": level_seed, "generator_version": GENERATOR_VERSION}
        return self._render_obs("The level begins."), info

    def normalize_action(self, action: str) -> str:
        return action.strip().lower()

    def _apply(self, action: str) -> StepOutcome:
        move = _ALIASES.get(action, action)
        if move not in MOVES:
            raise InvalidAction(f"{action[:60]!r} is not a move; say one of: up, down, left, right.")
        feedback = self._move(move)
        on = len(self._boxes & self._targets)
        solved = on == self.num_boxes
        if solved:
            feedback += " Every box is on a target: solved!"
        return StepOutcome(
            self._render_obs(feedback),
            reward=1.0 if solved else 0.0,
            terminated=solved,
            success=solved,
            progress=on / self.num_boxes,
        )

    def _move(self, move: str) -> str:
        """Apply ``move`` to the state; return what it did, in words."""
        d = self._deltas[move]
        what, self._player = apply_move(self._walls, self._boxes, self._player, d)
        if what == "wall":
            return "You bump into a wall."
        if what == "blocked":
            return "The box does not move."
        if what == "push":
            return f"You push a box {move}" + (" onto a target." if self._player + d in self._targets else ".")
        return f"You move {move}."

    def _admissible_actions(self) -> list[str]:
        return list(MOVES)

    def _render_obs(self, feedback: str) -> str:
        cells = self._static.copy()
        for b in self._boxes:
            cells[b] = "*" if b in self._targets else "$"
        p = self._player
        cells[p] = "+" if p in self._targets else "@"
        n = self.size
        grid = "\n".join("".join(cells[i : i + n]) for i in range(0, n * n, n))
        on = len(self._boxes & self._targets)
        return (
            f"Goal: {self._task_text}\n{grid}\n{LEGEND}\n"
            f"Boxes on targets: {on}/{self.num_boxes}. {feedback}\nActions: up, down, left, right"
        )

    # --------------------------------------------------------------- oracle
    def oracle_action(self) -> str:
        key = (self._player, frozenset(self._boxes))
        if key != self._plan_key or not self._plan:
            self._plan = solve(list(self._walls), self._targets, self._boxes, self._player, self.size) or []
        if not self._plan:
            return "up"  # unsolvable from here (boxes deadlocked); any move is as good
        move = self._plan.pop(0)
        self._plan_key = self._simulate(move)
        return move

    def _simulate(self, move: str) -> tuple[int, frozenset[int]]:
        """The state ``move`` would lead to, without changing this one (the plan's next key)."""
        boxes = set(self._boxes)
        _, player = apply_move(self._walls, boxes, self._player, self._deltas[move])
        return player, frozenset(boxes)

    # ------------------------------------------------------------ for tools
    def state(self) -> dict[str, Any]:
        """The raw grid state (for tests and benchmarks)."""
        return {"player": self._player, "boxes": set(self._boxes), "targets": set(self._targets), "walls": self._walls}

