"""A push-optimal BFS Sokoban solver with dead-square pruning.

Cells are flat indices ``r * width + c``. A search state is the set of box cells plus
the top-left-most cell the player can reach (so states that differ only by where the
player stands inside one region are merged).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

MOVES = ("up", "down", "left", "right")


def deltas(width: int) -> dict[str, int]:
    """The cell offset of each move on a grid ``width`` cells wide."""
    return {"up": -width, "down": width, "left": -1, "right": 1}


def apply_move(walls: Sequence[bool], boxes: set[int], player: int, d: int) -> tuple[str, int]:
    """One Sokoban move, in place on ``boxes``: the one implementation of the push rules.

    The player steps by offset ``d``. A box in the way is pushed one cell further if that cell
    holds neither a wall nor another box; otherwise nothing moves.

    Returns:
        ``(what, player)``: ``what`` is ``"wall"`` or ``"blocked"`` (nothing moved), ``"push"``
        (the box from ``player + d`` is now at ``player + 2d`` in ``boxes``) or ``"walk"``, and
        ``player`` is the player's cell after the move.
    """
    nxt = player + d
    if walls[nxt]:
        return "wall", player
    if nxt in boxes:
        beyond = nxt + d
        if walls[beyond] or beyond in boxes:
            return "blocked", player
        boxes.remove(nxt)
        boxes.add(beyond)
        return "push", nxt
    return "walk", nxt


def live_squares(walls: list[bool], targets: Iterable[int], width: int) -> set[int]:
    """Cells from which a lone box can still be pushed onto some target.

    Computed by pulling a box backwards from every target: a box can reach a target from
    cell ``c`` iff the reverse pull ``target <- c`` is possible along free cells.
    """
    live = set(targets)
    frontier = deque(live)
    ds = deltas(width).values()
    while frontier:
        cell = frontier.popleft()
        for d in ds:
            prev, player = cell - d, cell - 2 * d  # box came from prev, pushed by a player at prev - d
            if 0 <= player < len(walls) and not walls[prev] and not walls[player] and prev not in live:
                live.add(prev)
                frontier.append(prev)
    return live


def reachable(walls: list[bool], boxes: frozenset[int] | set[int], start: int, width: int) -> dict[int, int | None]:
    """Player-reachable cells, each mapped to its BFS parent (for path reconstruction)."""
    parent: dict[int, int | None] = {start: None}
    frontier = deque([start])
    ds = (-width, width, -1, 1)
    while frontier:
        cell = frontier.popleft()
        for d in ds:
            n = cell + d
            if n not in parent and not walls[n] and n not in boxes:
                parent[n] = cell
                frontier.append(n)
    return parent


def walk(parent: dict[int, int | None], goal: int, width: int) -> list[str]:
    """Moves from the BFS root to ``goal`` along ``parent`` links."""
    names = {-width: "up", width: "down", -1: "left", 1: "right"}
    path = []
    while parent[goal] is not None:
        prev = parent[goal]
        path.append(names[goal - prev])
        goal = prev
    return path[::-1]


def solve(
    walls: list[bool],
    targets: Iterable[int],
    boxes: Iterable[int],
    player: int,
    width: int,
    max_states: int = 200_000,
) -> list[str] | None:
    """The moves that put every box on a target, or ``None`` if unsolvable within ``max_states``.

    Args:
        walls: flat list, True for walls; the border must be walls.
        targets: target cells.
        boxes: box cells.
        player: the player's cell.
        width: row length.
        max_states: search budget.
    """
    targets = frozenset(targets)
    start_boxes = frozenset(boxes)
    live = live_squares(walls, targets, width)
    if not start_boxes <= live:
        return None
    ds = deltas(width)

    def key(bxs: frozenset[int], p: int) -> tuple[frozenset[int], int]:
        return bxs, min(reachable(walls, bxs, p, width))

    start = key(start_boxes, player)
    # state -> (previous state, player cell before the push, push direction name, player cell after)
    came: dict[tuple[frozenset[int], int], tuple | None] = {start: None}
    frontier = deque([(start_boxes, player, start)])
    while frontier:
        bxs, p, k = frontier.popleft()
        if bxs <= targets:
            return _reconstruct(came, k, walls, width, player, start_boxes)
        region = reachable(walls, bxs, p, width)
        for box in bxs:
            for name, d in ds.items():
                stand, dest = box - d, box + d
                if stand not in region or walls[dest] or dest in bxs or dest not in live:
                    continue
                nb = (bxs - {box}) | {dest}
                nk = key(nb, box)
                if nk in came:
                    continue
                came[nk] = (k, stand, name, box, bxs)
                if len(came) > max_states:
                    return None
                frontier.append((nb, box, nk))
    return None


def _reconstruct(came, k, walls, width, player, start_boxes) -> list[str]:
    pushes = []
    while came[k] is not None:
        prev, stand, name, after, bxs = came[k]
        pushes.append((stand, name, after, bxs))
        k = prev
    moves: list[str] = []
    p = player
    for stand, name, after, bxs in reversed(pushes):
        moves += walk(reachable(walls, bxs, p, width), stand, width)
        moves.append(name)
        p = after
    return moves
