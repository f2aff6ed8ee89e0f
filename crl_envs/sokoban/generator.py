"""Seeded Sokoban level generation by reverse play (numpy only).

1. Carve a room: a random walk with a random brush inside a walled square.
2. Put the boxes on random targets and the player on a free cell.
3. Play backwards: the player walks and *pulls* boxes off their targets. Every pull is
   the reverse of a push, so the result is solvable by construction; we keep the state
   that moved the boxes furthest (gym-sokoban's room score: box swaps times the total
   box displacement).
4. Verify with the BFS solver and store the solution length.

Every level returned has been verified solvable.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from crl_envs.sokoban.solver import solve

GENERATOR_VERSION = 1
_BRUSHES = (((0, 0),), ((0, 0), (0, 1)), ((0, 0), (1, 0)), ((0, 0), (0, 1), (1, 0), (1, 1)))


@dataclass(frozen=True)
class Level:
    """A Sokoban level on a flat grid (cell = row * width + col)."""

    width: int
    height: int
    walls: tuple[bool, ...]
    targets: frozenset[int]
    boxes: frozenset[int]
    player: int
    solution_length: int


class GenerationError(RuntimeError):
    """No solvable level was found within the retry budget."""


def _carve(size: int, rng: np.random.Generator) -> list[bool]:
    walls = [True] * (size * size)
    inner = size - 2
    r, c = int(rng.integers(1, size - 1)), int(rng.integers(1, size - 1))
    steps = int(1.5 * inner * inner)
    dirs = ((-1, 0), (1, 0), (0, -1), (0, 1))
    turns = rng.random(steps).tolist()
    new_dirs = rng.integers(4, size=steps).tolist()
    brushes = rng.integers(len(_BRUSHES), size=steps).tolist()
    d = dirs[new_dirs[0]]
    for i in range(steps):
        if turns[i] < 0.35:
            d = dirs[new_dirs[i]]
        r = min(max(r + d[0], 1), size - 2)
        c = min(max(c + d[1], 1), size - 2)
        for dr, dc in _BRUSHES[brushes[i]]:
            rr, cc = min(r + dr, size - 2), min(c + dc, size - 2)
            walls[rr * size + cc] = False
    return walls


def _reverse_play(
    walls: list[bool], targets: list[int], player: int, size: int, rng: np.random.Generator, steps: int
) -> tuple[frozenset[int], int, float]:
    boxes = set(targets)
    target_set = frozenset(targets)
    origin = {b: b for b in boxes}  # current cell -> the target it started on
    ds = (-size, size, -1, 1)
    # Draw all randomness up front: per-call numpy Generator overhead dominates otherwise.
    dirs = rng.integers(4, size=steps).tolist()
    coins = rng.random(steps).tolist()
    picks = rng.integers(1 << 30, size=steps).tolist()
    best = (frozenset(boxes), player, 0.0)
    swaps = 0
    displacement = 0
    last_box = None
    for i in range(steps):
        d = ds[dirs[i]]
        if coins[i] < 0.5:  # prefer pulling an adjacent box: a plain random walk undoes its own pulls
            pulls = [e for e in ds if player - e in boxes and not walls[player + e] and player + e not in boxes]
            if pulls:
                d = pulls[picks[i] % len(pulls)]
        nxt = player + d
        if walls[nxt] or nxt in boxes:
            continue
        behind = player - d
        if behind in boxes:  # pull the box behind us onto our cell
            o = origin.pop(behind)
            boxes.remove(behind)
            boxes.add(player)
            origin[player] = o
            displacement += _dist(player, o, size) - _dist(behind, o, size)
            if last_box != behind:  # a different box than the one pulled last
                swaps += 1
            last_box = player
            score = swaps * displacement
            if score > best[2] and not boxes <= target_set:
                best = (frozenset(boxes), nxt, float(score))
        player = nxt
    return best


def _dist(a: int, b: int, size: int) -> int:
    return abs(a // size - b // size) + abs(a % size - b % size)


def generate_level(
    size: int, num_boxes: int, rng: np.random.Generator, max_tries: int = 5000, min_moves: int | None = None
) -> Level:
    """A verified-solvable ``size`` x ``size`` level with ``num_boxes`` boxes.

    Rooms are tried one after another from ``rng`` until one qualifies, so a larger ``max_tries`` changes only
    the seeds a smaller one failed on (at 200, one 6x6 one-box seed in 1,500 failed: ``reset(seed=44)``).

    Levels whose shortest push solution takes fewer than ``min_moves`` moves (default
    ``2 * (size - 2)``) are rejected: reverse play often leaves boxes next to their targets.

    Raises:
        GenerationError: if ``max_tries`` rooms all fail (only for impossible settings).
    """
    if size < 5 or num_boxes < 1:
        raise ValueError(f"need size >= 5 and num_boxes >= 1, got size={size}, num_boxes={num_boxes}")
    if min_moves is None:
        min_moves = 2 * (size - 2)
    for _ in range(max_tries):
        walls = _carve(size, rng)
        floor = [i for i, w in enumerate(walls) if not w]
        if len(floor) < num_boxes + 3:
            continue
        picks = rng.choice(len(floor), size=num_boxes + 1, replace=False)
        targets = [floor[int(i)] for i in picks[:-1]]
        player = floor[int(picks[-1])]
        boxes, player, score = _reverse_play(walls, targets, player, size, rng, steps=12 * (size - 2) ** 2)
        if score <= 0:
            continue
        plan = solve(walls, targets, boxes, player, size)
        if plan is None or len(plan) < min_moves:
            continue
        return Level(size, size, tuple(walls), frozenset(targets), boxes, player, len(plan))
    raise GenerationError(f"no solvable {size}x{size} level with {num_boxes} boxes in {max_tries} tries")


@functools.lru_cache(maxsize=2048)
def level_for_seed(size: int, num_boxes: int, seed: int) -> Level:
    """The level for one seed (cached: generation costs milliseconds, lookups nanoseconds)."""
    return generate_level(size, num_boxes, np.random.default_rng(seed))
