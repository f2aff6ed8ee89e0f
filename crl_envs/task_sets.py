"""Task sets, as in the Complementary RL paper.

The MiniHack members are the ids the official Complementary RL code trains on:
Room -> ``Room-Ultimate-5x5``, Maze -> ``MazeWalk-9x9`` and KeyRoom -> ``KeyRoom-S5``.
Sokoban uses the official code's default room: 6x6 with 2 boxes. ``eval.run --tasks`` and
``crl_agent.train --tasks`` both take a set's name or a comma list of ids.
"""

from __future__ import annotations

from crl_envs.registry import check_env_id

TASK_SETS: dict[str, tuple[str, ...]] = {
    "3": (
        "crl/MiniHack-Room-Ultimate-5x5-v0",
        "crl/WebShop-v0",
        "crl/ALFWorld-v0",
    ),
    "6": (
        "crl/MiniHack-Room-Ultimate-5x5-v0",
        "crl/WebShop-v0",
        "crl/ALFWorld-v0",
        "crl/MiniHack-MazeWalk-9x9-v0",
        "crl/MiniHack-KeyRoom-S5-v0",
        "crl/Sokoban-6x6-2-v0",
    ),
    "swe": ("crl/SWE-Mini-v0",),
}


class TaskSetError(ValueError):
    """A task set or env id that cannot run here."""


def resolve_tasks(spec: str) -> list[str]:
    """Turn ``3``, ``6``, ``swe`` or a comma list of ids into env ids, checking each.

    Raises:
        TaskSetError: naming every member that is unknown or whose backend is missing.
    """
    spec = spec.strip()
    ids = list(TASK_SETS[spec]) if spec in TASK_SETS else [s.strip() for s in spec.split(",") if s.strip()]
    if not ids:
        raise TaskSetError(f"no tasks in {spec!r}; use one of {sorted(TASK_SETS)} or a comma list of env ids")
    problems = []
    for env_id in ids:
        try:
            check_env_id(env_id)
        except Exception as e:  # noqa: BLE001 - collect every problem for one clear message
            problems.append(f"  - {e}")
    if problems:
        where = f"task set {spec!r}" if spec in TASK_SETS else "--tasks"
        raise TaskSetError(f"{where} cannot run here:\n" + "\n".join(problems))
    return ids
