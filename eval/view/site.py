"""Write the static site: ``index.html``, the app's assets and the data as ``<script>`` files.

Layout of ``OUT``::

    index.html               the single page; a Content-Security-Policy forbids inline script and remote loads
    assets/                  view.css and the app's scripts (package data of eval.view)
    data/site.js             the manifest: runs with their summaries, the leaderboard, chunk boundaries
    data/<run>/index.js      the episode index of one run (loaded when the run is opened)
    data/<run>/traj-N.js     steps of consecutive episodes, about CHUNK_BYTES each (loaded per episode)
    data/<run>/search-N.js   the search text of consecutive episodes (loaded on the first search)
    data/<run>/actions.js    every episode's actions (loaded by the compare view)
    data/<run>/stream.js     an experience-track run's episodes in stream order with what each read from memory
                             and wrote (eval.view.stream; loaded by the stream page and compare)
    data/stamp.js            the build's id: a page built with --watch loads it again now and then, and reloads
                             itself when a newer build has replaced the data

A build writes its data into a new folder and then swaps it for ``data/``, so a page open while
``python -m eval.view --watch`` rebuilds never reads half a build.

Data files are scripts, not JSON fetched at run time, because ``fetch()`` fails on ``file://`` pages; each
one calls ``CRLVIEW.put(key, JSON.parse("<the data as JSON>"))``. The data is a string literal handed to
``JSON.parse`` rather than a JavaScript object literal, so a key such as ``__proto__`` stays a plain key
(an object literal would set the object's prototype) and V8 parses it faster. No string in a data file can
end the script early (``</script>`` only matters inside an HTML page).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from eval.view.data import INDEX_FIELDS, STEP_FIELDS, RunData
from eval.view.training import TrainingData

CHUNK_BYTES = 256 * 1024
SEARCH_CHUNK_BYTES = 2 * 1024 * 1024
MARKER = ".crl-view-site"
APP_SCRIPTS = ("core.js", "leaderboard.js", "run.js", "episodes.js", "steps.js", "episode.js", "compare.js",
               "chart.js", "training.js", "stream.js", "main.js")

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
       "connect-src 'none'; object-src 'none'; base-uri 'none'; form-action 'none'")

INDEX_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="assets/view.css">
</head>
<body>
<header id="top"><a id="home" href="#/">crl-bench</a><nav id="crumbs"></nav>
<span class="spacer"></span><a href="#/compare">Compare</a><button id="help-button" type="button">?</button></header>
<main id="app"><p class="loading">Loading…</p></main>
<noscript>This viewer needs JavaScript.</noscript>
<script src="assets/core.js"></script>
<script src="data/site.js"></script>
{scripts}
</body>
</html>
"""


@dataclass
class SiteStats:
    """What a build wrote: file count and bytes, the largest data file, and what could not be read."""

    files: int
    bytes: int
    largest: int
    warnings: list[str] = field(default_factory=list)


def _html_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _to_json(data: Any) -> str:
    # ensure_ascii: no lone surrogate from a foreign run can make the file invalid UTF-8.
    return json.dumps(data, ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def _put(key: str, json_text: str) -> str:
    """A data script: ``json_text`` as a JS string literal (a JSON string is one) parsed by ``JSON.parse``."""
    return f"CRLVIEW.put({json.dumps(key)},JSON.parse({json.dumps(json_text)}));\n"


def _script(key: str, data: Any) -> str:
    return _put(key, _to_json(data))


def _chunks(items: Iterable[str], budget: int) -> list[list[int]]:
    """Split consecutive items (already serialised) into groups of about ``budget`` bytes; returns indices."""
    groups: list[list[int]] = [[]]
    size = 0
    for i, s in enumerate(items):
        if groups[-1] and size + len(s) > budget:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += len(s) + 1
    return [g for g in groups if g]


def prepare_out(out: Path) -> None:
    """Empty ``out`` for a new site, refusing a non-empty folder that is not a site this module wrote."""
    if out.exists():
        if not out.is_dir():
            raise FileExistsError(f"{out}: exists and is not a folder; choose another --out")
        if any(out.iterdir()) and not (out / MARKER).exists():
            raise FileExistsError(f"{out}: not empty and not a crl-bench site; choose an empty or new --out folder")
        shutil.rmtree(out / "assets", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by python -m eval.view; the whole folder is rewritten on the next build\n")


def _write(path: Path, content: str, sizes: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode("utf-8")
    path.write_bytes(data)
    sizes.append(len(data))


def write_run(data_dir: Path, run: RunData, sizes: list[int]) -> dict[str, Any]:
    """Write one run's data files into ``data_dir``; return its manifest entry."""
    folder = data_dir / run.id
    chunk_of: list[list[int] | None] = [None] * len(run.rows)
    serialised = [_to_json(p) if p else "null" for p in run.payloads]
    with_steps = [i for i, p in enumerate(run.payloads) if p is not None]
    groups = _chunks((serialised[i] for i in with_steps), CHUNK_BYTES)
    for c, group in enumerate(groups):
        members = [with_steps[j] for j in group]
        for pos, i in enumerate(members):
            chunk_of[i] = [c, pos]
        key = f"{run.id}/traj-{c}"
        _write(folder / f"traj-{c}.js", _put(key, "[" + ",".join(serialised[i] for i in members) + "]"), sizes)
    rows = [[*row, chunk_of[i]] for i, row in enumerate(run.rows)]
    _write(folder / "index.js", _script(f"{run.id}/index", {"fields": [*INDEX_FIELDS, "chunk"], "rows": rows}), sizes)
    search_groups = _chunks(run.search, SEARCH_CHUNK_BYTES)
    for c, group in enumerate(search_groups):
        _write(folder / f"search-{c}.js", _script(f"{run.id}/search-{c}", [run.search[i] for i in group]), sizes)
    vocab: dict[str, int] = {}
    ids = [None if a is None else [vocab.setdefault(x, len(vocab)) for x in a] for a in run.actions]
    _write(folder / "actions.js", _script(f"{run.id}/actions", {"vocab": list(vocab), "episodes": ids}), sizes)
    if run.stream:
        _write(folder / "stream.js", _script(f"{run.id}/stream", run.stream), sizes)
    return {
        "id": run.id, "label": run.label, "folder": run.folder, "tasks": run.tasks, "summary": run.summary,
        "episodes": len(run.rows), "trajectories": run.meta.get("trajectories", 0), "chunks": len(groups),
        "search_starts": [g[0] for g in search_groups], "warnings": run.warnings,
        "episodes_file": run.meta.get("episodes_file", "present"),
        "trajectories_file": run.meta.get("trajectories_file", "present"),
        "no_steps": run.meta.get("no_steps", 0), "training": run.meta.get("training"),
        "stream_episodes": len(run.stream),
    }


def write_site(out: Path, runs: list[RunData], leaderboard: dict[str, Any] | None = None,
               title: str = "crl-bench results", trainings: list[TrainingData] | None = None,
               problems: list[str] | None = None, watch: float = 0.0) -> SiteStats:
    """Write a complete site for ``runs`` and ``trainings`` (and a leaderboard) into ``out``; returns its size.

    ``problems``: what the build left out (folders that are not runs, runs that could not be read), listed on the
    start page. ``watch``: seconds between the page's checks for a newer build (0: none).

    Raises:
        FileExistsError: ``out`` holds something other than an earlier site.
    """
    prepare_out(out)
    sizes: list[int] = []
    assets = resources.files("eval.view") / "static"
    (out / "assets").mkdir(parents=True, exist_ok=True)
    for name in ("view.css", *APP_SCRIPTS):
        content = (assets / name).read_text(encoding="utf-8")
        _write(out / "assets" / name, content, sizes)
    next_data = out / ".data-next"
    shutil.rmtree(next_data, ignore_errors=True)
    stamp = f"{time.time_ns()}"
    problems = list(problems or [])
    manifest = {
        "title": title, "step_fields": STEP_FIELDS, "leaderboard": leaderboard,
        "runs": [write_run(next_data, r, sizes) for r in runs],
        "trainings": [t.manifest() for t in trainings or []], "problems": problems, "watch": watch, "stamp": stamp,
    }
    _write(next_data / "site.js", _script("site", manifest), sizes)
    _write(next_data / "stamp.js", f"CRLVIEW.stamp({json.dumps(stamp)});\n", sizes)
    old = out / ".data-old"
    shutil.rmtree(old, ignore_errors=True)
    if (out / "data").exists():
        os.replace(out / "data", old)
    os.replace(next_data, out / "data")
    shutil.rmtree(old, ignore_errors=True)
    scripts = "\n".join(f'<script src="assets/{s}"></script>' for s in APP_SCRIPTS if s != "core.js")
    _write(out / "index.html", INDEX_HTML.format(csp=CSP, title=_html_escape(title), scripts=scripts), sizes)
    return SiteStats(files=len(sizes), bytes=sum(sizes), largest=max(sizes),
                     warnings=problems + [w for r in runs for w in r.warnings])
