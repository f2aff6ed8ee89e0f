"""Number formatting shared by every results table (``eval.report``, ``leaderboards.build``, the viewer).

Kept free of heavy imports so that leaderboard tooling can use it without loading envs or agents.
"""

from __future__ import annotations


def pct(x: float | None) -> str:
    """A fraction as a percentage with one decimal, e.g. ``0.1234`` -> ``"12.3"``.

    The one rule for missing values: NaN (a task with no episodes, or a standard error of nothing) and
    ``None`` (NaN after a round trip through strict JSON) show as ``n/a``, never as ``nan`` or an error.
    """
    return "n/a" if x is None or x != x else f"{100 * x:.1f}"
