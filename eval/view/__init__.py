"""A static, offline site for eval runs: run pages, an episode list and viewer, and a side-by-side compare.

Build one with ``python -m eval.view RUN [RUN ...] --out DIR`` and open ``DIR/index.html`` (from disk or any
static server). ``leaderboards.build --html DIR`` uses :func:`build_site` for the leaderboard site.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eval.view.data import RunData, load_run_data, slug
from eval.view.site import SiteStats, write_site

__all__ = ["RunData", "SiteStats", "build_site", "expand_run_dirs", "load_runs"]


def expand_run_dirs(paths: list[Path]) -> list[Path]:
    """Run folders to show: each path that holds a ``summary.json``, else its subfolders that do.

    So a folder of runs (a sweep, or a trainer's periodic evaluations) can be passed whole. A path with
    neither stays, so that loading it names the missing ``summary.json``.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        children = sorted(c for c in p.iterdir() if (c / "summary.json").is_file()) if p.is_dir() else []
        out += [p] if (p / "summary.json").exists() or not children else children
    return out


def load_runs(run_dirs: list[Path], labels: list[str] | None = None) -> list[RunData]:
    """Read run folders, giving each a unique id (from its folder name) and a label (its agent, or ``labels``).

    Raises:
        FileNotFoundError: a folder has no ``summary.json``.
        ValueError: a summary is not JSON or not a crl-bench summary.
    """
    from eval.report import run_labels

    runs: list[RunData] = []
    used: set[str] = set()
    for i, d in enumerate(run_dirs):
        base = slug(Path(d).resolve().name)
        run_id, n = base, 2
        while run_id in used:
            run_id, n = f"{base}-{n}", n + 1
        used.add(run_id)
        runs.append(load_run_data(Path(d), run_id, labels[i] if labels else None))
    if not labels:
        for run, label in zip(runs, run_labels([r.summary for r in runs], [Path(d) for d in run_dirs]), strict=True):
            run.label = label
    return runs


def build_site(out: Path, run_dirs: list[Path], leaderboard: dict[str, Any] | None = None,
               labels: list[str] | None = None, title: str = "crl-bench results") -> SiteStats:
    """Read ``run_dirs`` (see :func:`expand_run_dirs`) and write the site to ``out``; layout in :mod:`eval.view.site`."""
    dirs = run_dirs if labels else expand_run_dirs(run_dirs)
    return write_site(Path(out), load_runs(dirs, labels), leaderboard=leaderboard, title=title)
