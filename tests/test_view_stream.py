"""An experience-track run (``eval.run --stream``) in the viewer, in a real browser at 390×844 and 1280×800
(``pytest -m browser``): the stream page (each world's episodes in order, with memory paired with without,
what each read and wrote, the success curves and the experience gain) and Compare's with-vs-without pair.

The run is real: the ``notebook`` agent (no model) on ``crl/MiniHack-Corridors-3-v0``, 2 worlds × streams of 3.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
pytest.importorskip("pytest_playwright", reason="pytest-playwright is not installed (pip install -e '.[test]')")

from eval.results import EpisodeLog  # noqa: E402
from eval.trajectories import load_trajectories  # noqa: E402
from eval.view import build_site  # noqa: E402
from eval.view.stream import memory_read  # noqa: E402
from tests import test_view_browser as B  # noqa: E402

browser, context, page = B.browser, B.context, B.page  # the same Chromium, one per module
SIZES = [(390, 844), (1280, 800)]
TASK = "crl/MiniHack-Corridors-3-v0"
STREAM, WORLDS = 3, 2
ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def stream_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stream") / "notebook"
    subprocess.run([sys.executable, "-m", "eval.run", "--agent", "notebook", "--tasks", TASK, "--stream", str(STREAM),
                    "--episodes", str(WORLDS), "--seed", "1000", "--out", str(out), "--quiet"],
                   check=True, cwd=ROOT, env=ENV, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def site(stream_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    build_site(out, [stream_run])
    return out


def _data(path: Path):
    """The data a ``CRLVIEW.put(key, data);`` file carries."""
    m = re.fullmatch(r'CRLVIEW\.put\(("[^"]*"),JSON\.parse\((".*")\)\);\n', path.read_text(encoding="utf-8"), re.S)
    assert m, path
    return json.loads(json.loads(m.group(2)))


def _records(run: Path) -> dict[tuple[int, int], dict]:
    """(seed, sample) -> the episode's record."""
    return {(r["seed"], r["sample"]): r for r in EpisodeLog(run / "episodes.jsonl").latest().values()}


def _trajs(run: Path) -> dict[tuple[int, int], dict]:
    return {(t["seed"], t["sample"]): t for t in load_trajectories(run)}


def test_every_stream_episode_reaches_the_site_with_what_it_read_and_wrote(stream_run, site):
    """Before: load_run_checked kept only seeds 1000..1001 (the summary's --seed/--episodes), so a stream run
    (seeds world*1000+j) had no episode in the viewer, and nothing said what an episode read or wrote."""
    manifest = _data(site / "data" / "site.js")
    run = manifest["runs"][0]
    assert run["episodes"] == run["stream_episodes"] == STREAM * WORLDS * 2
    assert run["summary"]["stream"]["stream"] == STREAM
    entries = _data(site / "data" / run["id"] / "stream.js")
    records, trajs = _records(stream_run), _trajs(stream_run)
    for e in entries:
        r = records[(e["seed"], 0 if e["memory"] else 1)]
        assert (e["world"], e["j"], e["memory"]) == (r["world"], r["stream_index"], r["memory"])
        if not e["memory"]:
            assert e["read"] == [] and e["wrote"] == []  # the memory protocol: off reads and writes nothing
            continue
        written = r["extra"]["memory_write"]
        assert written and e["wrote"] == [f"{k}: {v}" for k, v in written.items()]
        assert e["read"] == memory_read(trajs[(e["seed"], 0)])
        assert (e["read"] == []) == (e["j"] == 0)  # a world's first episode has nothing to read; later ones do


def _expected(stream_run: Path) -> dict[tuple[int, int], dict]:
    """(world, j) -> seed, outcomes with and without memory, and the lines read (from the trajectories)."""
    records, trajs = _records(stream_run), _trajs(stream_run)
    out = {}
    for (seed, sample), r in records.items():
        if sample == 0:
            off = records[(seed, 1)]
            turn_reads = memory_read(trajs[(seed, 0)])
            out[(r["world"], r["stream_index"])] = {
                "seed": seed, "on": "success" if r["success"] else "failure",
                "off": "success" if off["success"] else "failure", "read": turn_reads,
                "wrote": [f"{k}: {v}" for k, v in r["extra"]["memory_write"].items()]}
    return out


@pytest.mark.browser
@pytest.mark.parametrize("size", SIZES, ids=["phone", "desktop"])
def test_the_stream_page_lists_each_world_in_order_paired_with_its_memoryless_play(stream_run, site, page, size):
    page.set_viewport_size({"width": size[0], "height": size[1]})
    page.goto((site / "index.html").as_uri() + "#/run")
    page.click("#stream-link")
    page.wait_for_selector(".stream-task")
    summary = json.loads((stream_run / "summary.json").read_text())["stream"]["tasks"][TASK]
    gain = summary["experience_gain"] * 100
    assert f"{gain:+.1f} ± {summary['experience_gain_se'] * 100:.1f} points" in page.inner_text("#gain-0")
    # the curve: both series, with one point per stream position
    for key in ("memory", "no_memory"):
        assert page.locator(f"#stream-curve-0 [data-series={key}] circle").count() == STREAM
    expected = _expected(stream_run)
    worlds = page.locator("section.world")
    assert worlds.count() == WORLDS
    for w in range(WORLDS):
        cards = page.locator(f"#world-MiniHack-Corridors-3-{1000 + w} li.stream-ep")
        assert cards.count() == STREAM
        for j in range(STREAM):
            exp, card = expected[(1000 + w, j)], cards.nth(j)
            assert card.get_attribute("data-seed") == str(exp["seed"])
            assert card.locator(".stream-ep-head").inner_text().startswith(f"episode {j + 1}")
            assert card.locator(".stream-side.with .badge").inner_text() == exp["on"]
            assert card.locator(".stream-side.without .badge").inner_text() == exp["off"]
            read = card.locator(".stream-side.with .mem.read li").all_inner_texts()
            assert read == exp["read"][:4]
            assert card.locator(".stream-side.with .mem.wrote li").all_inner_texts() == exp["wrote"][:4]
            assert card.locator(".stream-side.without .mem").count() == 0
    # world 1000's second episode read what its first wrote (the notebook's dead end), a real memory hand-off
    assert expected[(1000, 1)]["read"], "the stream should carry memory from episode 1 to 2"
    assert page.evaluate("document.scrollingElement.scrollWidth") <= size[0]
    page.screenshot(path=str(site.parent / f"stream-{size[0]}.png"), full_page=True)

    # Compare: the with-memory vs without-memory pair of one episode, side by side
    exp = expected[(1000, 1)]
    page.locator("#world-MiniHack-Corridors-3-1000 li.stream-ep").nth(1).locator("a.compare-pair").click()
    page.wait_for_selector(".side-label")
    assert page.inner_text("h1") == "Compare with and without memory"
    labels = page.locator(".side-label").all_inner_texts()
    assert labels[0].startswith("A with memory") and exp["on"] in labels[0]
    assert labels[1].startswith("B without memory") and exp["off"] in labels[1]
    page.wait_for_selector("#pair-memory li")
    assert page.locator("#pair-memory .mem.read li").all_inner_texts() == exp["read"][:4]
    assert f"seed {exp['seed']}" in page.inner_text("h2")
    # the two sides are the two plays of the seed: the step counts match the records
    records = _records(stream_run)
    steps_a = records[(exp["seed"], 0)]["actions"]
    steps_b = records[(exp["seed"], 1)]["actions"]
    assert page.locator(".cmp-row").count() == max(steps_a, steps_b) + 1
    assert page.evaluate("document.scrollingElement.scrollWidth") <= size[0]
    page.screenshot(path=str(site.parent / f"stream-compare-{size[0]}.png"))  # the top: heading, memory note, pair


@pytest.mark.browser
@pytest.mark.parametrize("size", SIZES, ids=["phone", "desktop"])
def test_compare_on_a_lone_stream_run_pairs_every_seed_with_and_without_memory(stream_run, site, page, size):
    page.set_viewport_size({"width": size[0], "height": size[1]})
    page.goto((site / "index.html").as_uri() + "#/compare")
    page.wait_for_selector("#pairs-table")
    assert page.inner_text("h1") == "Compare with and without memory"
    rows = page.locator("#pairs-table tbody tr")
    assert rows.count() == STREAM * WORLDS
    records = _records(stream_run)
    split = [s for (s, k) in records if k == 0 and records[(s, 0)]["success"] != records[(s, 1)]["success"]]
    assert page.locator("#split-table tbody tr").count() == len(split) > 0
    assert page.evaluate("document.scrollingElement.scrollWidth") <= size[0]
