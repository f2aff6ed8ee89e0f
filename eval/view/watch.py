"""``python -m eval.view --watch``: rebuild the site whenever a run's files change.

Polling, not inotify: it works the same on every filesystem (a network mount, a container's bind mount) and
costs a ``stat`` per run file every few seconds. A run's files are found again at each poll, so a new run
folder under a watched folder (a sweep's next run, a trainer's next evaluation) is picked up too.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

# the files a site is built from; anything else in a run folder (checkpoints, TensorBoard, plots) is not read
WATCHED = {"summary.json", "episodes.jsonl", "trajectories.jsonl.gz", "eval.json", "config.json", "evals.jsonl",
           "metrics.jsonl"}
MAX_DEPTH = 4  # a tag folder / training run / evals / step-NNNN / half


def fingerprint(paths: list[Path]) -> tuple[tuple[str, int, int], ...]:
    """(path, size, mtime in ns) of every file the site is built from, under ``paths``."""
    out = []
    for root in map(Path, paths):
        base = len(root.parts)
        for folder, dirs, files in os.walk(root):
            if len(Path(folder).parts) - base >= MAX_DEPTH:
                dirs.clear()
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("tb", "adapters")]
            for name in files:
                if name in WATCHED:
                    try:
                        st = os.stat(os.path.join(folder, name))
                    except OSError:  # gone between the listing and the stat (a folder being replaced)
                        continue
                    out.append((os.path.join(folder, name), st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def watch(paths: list[Path], every: float, build: Callable[[], None], stop: Callable[[], bool] = lambda: False) -> None:
    """Call ``build`` after each change to the files under ``paths`` (checked every ``every`` seconds) until
    Ctrl-C (or ``stop()``). A build that fails (a file caught mid-write) is reported and tried again at the
    next change."""
    seen = fingerprint(paths)
    try:
        while not stop():
            time.sleep(every)
            now = fingerprint(paths)
            if now == seen:
                continue
            seen = now
            try:
                build()
            except (OSError, ValueError) as e:
                print(f"warning: rebuild failed ({e}); trying again at the next change", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        pass
