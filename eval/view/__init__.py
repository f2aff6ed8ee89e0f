"""A static, offline site for eval and training runs: run pages, an episode list and viewer, a side-by-side
compare, and a training run's learning curve with each held-out evaluation as a browsable run.

Build one with ``python -m eval.view RUN [RUN ...] --out DIR`` and open ``DIR/index.html`` (from disk or any
static server). ``leaderboards.build --html DIR`` uses :func:`build_site` for the leaderboard site.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eval.view.data import RunData, load_run_data, slug
from eval.view.incomplete import has_episodes_on_disk
from eval.view.site import SiteStats, write_site
from eval.view.training import TrainingData, is_training_run, load_training

__all__ = ["RunData", "SiteStats", "TrainingData", "build_site", "expand_inputs", "expand_run_dirs", "load_inputs",
           "load_runs"]


def _kind(path: Path) -> str | None:
    """``"run"`` (an eval.run folder, finished or not), ``"training"`` (a trainer's run folder) or ``None``."""
    if (path / "summary.json").exists() or has_episodes_on_disk(path):
        return "run"
    return "training" if is_training_run(path) else None


def expand_inputs(paths: list[Path]) -> tuple[list[tuple[str, Path]], list[str]]:
    """What to show of each path, and a warning for each subfolder left out.

    A path that is a run or a training run is shown as one; else its subfolders that are (a sweep, a trainer's
    tag folder ``runs/train_cpu/<tag>/`` of seeds). Each subfolder that is neither is named in a warning. A path
    with none stays a run, so that loading it names what is missing.
    """
    out: list[tuple[str, Path]] = []
    problems: list[str] = []
    for p in map(Path, paths):
        kind = _kind(p)
        children = [] if kind or not p.is_dir() else sorted(c for c in p.iterdir()
                                                             if c.is_dir() and not c.name.startswith("."))
        found = [(k, c) for c in children if (k := _kind(c))]
        if kind or not found:
            out.append((kind or "run", p))
            continue
        out += found
        problems += [f"{c}: skipped: no summary.json, episodes.jsonl or trajectories, and not a training run"
                     for c in children if _kind(c) is None]
    return out, problems


def expand_run_dirs(paths: list[Path]) -> list[Path]:
    """The run folders of :func:`expand_inputs` (training runs left out)."""
    return [p for kind, p in expand_inputs(paths)[0] if kind == "run"]


def _unique(name: str, used: set[str]) -> str:
    base = slug(name)
    out, n = base, 2
    while out in used:
        out, n = f"{base}-{n}", n + 1
    used.add(out)
    return out


def load_runs(run_dirs: list[Path], labels: list[str] | None = None) -> list[RunData]:
    """Read run folders, giving each a unique id (from its folder name) and a label (its agent, or ``labels``).

    Raises:
        FileNotFoundError: a folder has no ``summary.json`` and no episodes.
        ValueError: a summary is not JSON or not a crl-bench summary.
    """
    from eval.report import run_labels

    runs: list[RunData] = []
    used: set[str] = set()
    for i, d in enumerate(run_dirs):
        runs.append(load_run_data(Path(d), _unique(Path(d).resolve().name, used), labels[i] if labels else None))
    if not labels:
        for run, label in zip(runs, run_labels([r.summary for r in runs], [Path(d) for d in run_dirs]), strict=True):
            run.label = label
    return runs


def load_inputs(paths: list[Path]) -> tuple[list[RunData], list[TrainingData], list[str]]:
    """Read what :func:`expand_inputs` finds: runs, training runs (their evaluations among the runs), and a
    warning for each folder left out. Where there are several, one that cannot be read is left out with a
    warning naming it and why, and the rest are read.

    Raises:
        FileNotFoundError, ValueError: the only input cannot be read (as :func:`load_runs`).
    """
    from eval.report import run_labels

    items, problems = expand_inputs(paths)
    runs: list[RunData] = []
    trainings: list[TrainingData] = []
    used: set[str] = set()
    plain: list[tuple[RunData, Path]] = []
    for kind, p in items:
        try:
            if kind == "training":
                training, evals = load_training(p, _unique(p.resolve().name, used), used)
                trainings.append(training)
                runs += evals
                problems += training.warnings
            else:
                run = load_run_data(p, _unique(p.resolve().name, used), None)
                runs.append(run)
                plain.append((run, p))
        except (FileNotFoundError, ValueError) as e:
            if len(items) == 1:
                raise
            problems.append(f"skipped {p}: {e}")
    for (run, _), label in zip(plain, run_labels([r.summary for r, _ in plain], [p for _, p in plain]), strict=True):
        run.label = label
    if not runs and not trainings:
        raise FileNotFoundError("no run could be read: " + "; ".join(problems))
    return runs, trainings, problems


def build_site(out: Path, run_dirs: list[Path], leaderboard: dict[str, Any] | None = None,
               labels: list[str] | None = None, title: str = "crl-bench results", watch: float = 0.0) -> SiteStats:
    """Read ``run_dirs`` (runs, training runs, or folders of them: see :func:`expand_inputs`) and write the site
    to ``out``; layout in :mod:`eval.view.site`. ``watch``: the page checks for a newer build every so many
    seconds (``python -m eval.view --watch`` rebuilds as episodes land)."""
    if labels:
        return write_site(Path(out), load_runs(run_dirs, labels), leaderboard=leaderboard, title=title)
    runs, trainings, problems = load_inputs(run_dirs)
    return write_site(Path(out), runs, leaderboard=leaderboard, title=title, trainings=trainings,
                      problems=problems, watch=watch)
