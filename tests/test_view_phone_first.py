"""The number that matters first on a phone, and damage counted and marked, in a real browser at 390×844 and
1280×800 (``pytest -m browser``).

Runs are real ``eval.run`` runs (random on Sokoban) and the shipped leaderboard; the damage is done to copies of
them: the trajectories file cut in half, an ``episodes.jsonl`` line with a byte that is not UTF-8, a run whose
summary is not a crl-bench summary, a folder that is no run. Observations with bidi and zero-width controls and a
match 30,000 characters in are played-looking records written in eval.run's format.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
pytest.importorskip("pytest_playwright", reason="pytest-playwright is not installed (pip install -e '.[test]')")

from eval.trajectories import load_trajectories  # noqa: E402
from eval.view import build_site  # noqa: E402
from eval.view.__main__ import main as view_main  # noqa: E402
from tests import test_view_browser as B  # noqa: E402
from tests import view_fixtures as F  # noqa: E402

browser, context, page = B.browser, B.context, B.page  # the same Chromium, one per module
size, pg = B.size, B.pg  # each test at a phone's and a desktop's size, failing on any page error
pytestmark = pytest.mark.browser
SIZES = B.SIZES
TASK = F.SOKOBAN
ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
EVAL_ARGS = ["--agent", "random", "--tasks", TASK, "--episodes", "12", "--quiet"]
NEEDLE = "needle-past-the-cut"


def _eval_run(out: Path, *extra: str) -> Path:
    subprocess.run([sys.executable, "-m", "eval.run", *EVAL_ARGS, "--out", str(out), *extra], check=True, cwd=ROOT,
                   env=ENV, capture_output=True, timeout=300)
    return out


def _control_records() -> list[dict]:
    """Sokoban episodes whose text carries a right-to-left override, zero-width characters and a long line."""
    recs = [F.play_sokoban(s, "random", max_steps=4) for s in range(2)]
    steps = recs[0]["steps"]
    steps[0]["observation"] = "Saved as: report\u202egnp.exe\n" + steps[0]["observation"]
    steps[1]["action"] = "le\u200bft\u2060"
    steps[2]["observation"] = "noise " * 5000 + NEEDLE + "\n" + steps[2]["observation"]  # 30,000 characters in
    return recs


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    real = _eval_run(root / "random")
    cut = shutil.copytree(real, root / "cut")
    gz = cut / "trajectories.jsonl.gz"
    gz.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    resumed = shutil.copytree(cut, root / "resumed")
    _eval_run(resumed, "--resume")  # what the viewer used to advise
    utf8 = shutil.copytree(real, root / "utf8")
    lines = (utf8 / "episodes.jsonl").read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"env_id"', b'"note": "bad \xff byte", "env_id"', 1)
    (utf8 / "episodes.jsonl").write_bytes(b"".join(lines))
    return {"random": real, "cut": cut, "resumed": resumed, "utf8": utf8,
            "controls": F.write_run(root / "controls", _control_records(), {"name": "random"}),
            "oracle": F.write_run(root / "oracle", [F.play_sokoban(s, "oracle") for s in range(3)], {"name": "oracle"})}


@pytest.fixture(scope="module")
def site(runs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build_site(out, list(runs.values()))
    return out


@pytest.fixture(scope="module")
def board(runs, tmp_path_factory) -> Path:
    """The leaderboard site of the shipped submissions plus one with a long name."""
    from leaderboards.build import ROOT as BOARD
    from leaderboards.build import main as board_main

    tmp = tmp_path_factory.mktemp("board")
    subs = shutil.copytree(BOARD / "submissions", tmp / "subs")
    (shutil.copytree(runs["oracle"], subs / "2026-12-07_phone") / "metadata.yaml").write_text(yaml.safe_dump({
        "name": "oracle with a long name that goes on to say how it was run (seed 7, 40 steps, task set 6)",
        "model": "none", "agent": "oracle", "date": "2026-12-07", "url": "https://example.org/x", "verified": False}))
    assert board_main(["--submissions", str(subs), "--out", str(tmp / "b.md"), "--html", str(tmp / "site")]) == 0
    return tmp / "site"


_go = B.go


def _in_view(page, locator, width: int) -> None:
    """The element is whole (not cut) and inside the window, with the page not scrolled sideways."""
    box = locator.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, (locator.inner_text(), box)
    assert locator.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), locator.inner_text()
    assert page.evaluate("document.scrollingElement.scrollWidth") <= width


def _targets_are_big_enough(page) -> None:
    """Every control a finger can hit is at least 24 px each way. (A wide window's timeline marks, a few px wide,
    are for a mouse; on a phone they take no taps: the strip is the target.)"""
    small = page.evaluate("""() => Array.from(document.querySelectorAll('button, select, input, a.button'))
        .filter(e => e.offsetParent !== null && getComputedStyle(e).pointerEvents !== 'none')
        .filter(e => !(window.innerWidth > 640 && e.matches('.timeline .mark')))
        .map(e => [e.id || e.className || e.textContent, e.getBoundingClientRect()])
        .filter(x => x[1].width < 24 || x[1].height < 24).map(x => [x[0], x[1].width, x[1].height])""")
    assert small == []


# ---------------------------------------------------------------------------------------- phone first
def test_macro_success_is_on_screen_in_the_runs_list(pg, size, site):
    page = pg
    _go(page, site, "#/runs", "#runs-table")
    for cell in page.locator("#runs-table td.macro-success").all():
        _in_view(page, cell, size[0])
        assert " ± " in cell.inner_text()


def test_every_leaderboard_table_shows_its_success_column_on_screen(pg, size, board):
    page = pg
    _go(page, board, "", "table.leaderboard")
    tables = page.locator("section.board")
    assert tables.count() >= 3
    for i in range(tables.count()):
        cell = tables.nth(i).locator("tbody tr").first.locator("td.success")
        _in_view(page, cell, size[0])
    _targets_are_big_enough(page)


def test_the_episode_list_shows_outcome_and_reward_first_and_no_column_that_never_changes(pg, size, site, runs):
    page = pg
    _go(page, site, "#/episodes?run=random", ".vrow")
    heads = page.locator(".vhead > span").all_inner_texts()
    assert heads[:4] == ["task", "seed", "outcome", "reward"] and "sample" not in heads and "tokens out" not in heads
    rows = [json.loads(x) for x in (runs["random"] / "episodes.jsonl").read_text().splitlines()]
    for name, key in (("actions", "actions"), ("progress", "progress"), ("invalid", "invalid_actions")):
        assert (name in heads) == (len({r[key] for r in rows}) > 1), name
    first = page.locator(".vrow").first
    for col in (2, 3):  # outcome and reward
        _in_view(page, first.locator("> span").nth(col), size[0])
    _targets_are_big_enough(page)


def test_an_episode_steps_and_matches_with_buttons_and_its_outcome_and_reward_are_on_screen(pg, size, site, runs):
    page = pg
    _go(page, site, f"#/episode?run=random&task={TASK}&seed=0&q=up", ".step")
    meta = page.locator(".ep-head .meta")
    _in_view(page, meta.locator(".badge"), size[0])
    assert "reward " in meta.inner_text() and meta.bounding_box()["y"] + meta.bounding_box()["height"] <= size[1]
    count = page.locator("#hit-count")
    assert count.inner_text().startswith("match 1 of ")
    page.locator("#match-next").click()
    assert count.inner_text().startswith("match 2 of ")
    page.locator("#match-prev").click()
    assert count.inner_text().startswith("match 1 of ") and page.locator("mark.hit.current").count() == 1
    page.locator("#step-next").click()
    page.locator("#step-next").click()
    t = int(page.locator(".step.current").get_attribute("data-t"))
    page.locator("#step-prev").click()
    assert int(page.locator(".step.current").get_attribute("data-t")) == t - 1
    # a tap on the timeline picks the step under it (on a phone its 4 px marks are one 24 px tall target)
    strip = page.locator("[data-role=timeline]")
    box = strip.bounding_box()
    assert box["height"] >= 24
    page.mouse.click(box["x"] + 1, box["y"] + 12)
    assert page.locator(".step.current").get_attribute("data-t") == "0"
    _targets_are_big_enough(page)


def test_compare_steps_with_buttons(pg, size, site):
    page = pg
    _go(page, site, f"#/compare?a=random&b=oracle&task={TASK}&seed=1", ".cmp-row")
    page.locator("#step-next").click()
    first = int(page.locator(".cmp-row.current").get_attribute("data-t"))
    page.locator("#step-next").click()
    assert int(page.locator(".cmp-row.current").get_attribute("data-t")) == first + 1
    _targets_are_big_enough(page)
    assert page.evaluate("document.scrollingElement.scrollWidth") <= size[0]


# ---------------------------------------------------------------------------------------- damage
def test_episodes_without_their_steps_are_counted_and_marked_and_the_advice_is_true(pg, size, site, runs):
    page = pg
    kept = {t["seed"] for t in load_trajectories(runs["cut"])}
    lost = 12 - len(kept)
    assert 0 < lost < 12
    _go(page, site, "#/episodes?run=cut", ".vrow")
    assert page.locator("#count").inner_text().startswith(f"12 of 12 episodes · {lost} without their steps")
    marked = page.locator(".vrow.no-steps")
    assert marked.count() == lost and page.locator(".vrow .badge.no-steps").count() == lost
    assert sorted(int(x) for x in marked.locator("> span:nth-child(2)").all_inner_texts()) == sorted(set(range(12)) - kept)
    _go(page, site, "#/run?run=cut", "#run-warnings")
    warning = page.locator("#run-warnings").inner_text()
    assert f"{lost} of 12 episodes have no steps" in warning and "cannot be restored" in warning
    lost_seed = min(set(range(12)) - kept)
    _go(page, site, f"#/episode?run=cut&task={TASK}&seed={lost_seed}", "#no-trajectory")
    note = page.locator("#no-trajectory").inner_text()
    assert "repairs" not in note and "play the run again into a new folder" in note
    # the advice is true: --resume gave none of those steps back, and the viewer still counts them
    assert {t["seed"] for t in load_trajectories(runs["resumed"])} == kept
    _go(page, site, "#/episodes?run=resumed", ".vrow")
    assert f"{lost} without their steps" in page.locator("#count").inner_text()


def test_an_invalid_utf8_line_is_named_by_file_and_line(pg, site, runs):
    page = pg
    _go(page, site, "#/run?run=utf8", "#run-warnings")
    assert f"{runs['utf8'] / 'episodes.jsonl'}:2: not valid UTF-8 (byte 0xff" in page.locator("#run-warnings").inner_text()


def test_bidi_and_zero_width_controls_are_shown_as_tags(pg, site):
    page = pg
    _go(page, site, f"#/episode?run=controls&task={TASK}&seed=0&view=full", ".step")
    obs = page.locator("#step-0 pre.observation")
    assert obs.inner_text().startswith("Saved as: report‹U+202E›gnp.exe")
    assert page.locator("#step-1 code.action").inner_text() == "le‹U+200B›ft‹U+2060›"
    assert obs.locator("span.ctl").first.get_attribute("title").startswith("an invisible control character, U+202E")


def test_a_search_match_past_the_first_20000_characters_is_reachable(pg, size, site):
    page = pg
    _go(page, site, f"#/episode?run=controls&task={TASK}&seed=0&q={NEEDLE}", ".step")
    assert page.locator("#hit-count").inner_text().startswith("match 1 of 1")  # was "no match"
    hit = page.locator("mark.hit.current")
    assert hit.inner_text() == NEEDLE and hit.evaluate("m => m.closest('.step').id") == "step-2"
    box = hit.bounding_box()
    assert 0 <= box["y"] <= size[1]


def test_a_bad_run_in_a_multi_run_build_is_reported_and_skipped_and_so_is_a_folder_that_is_no_run(pg, runs, tmp_path,
                                                                                                    capsys):
    page = pg
    sweep = tmp_path / "sweep"
    shutil.copytree(runs["oracle"], sweep / "oracle")
    (sweep / "notes").mkdir(parents=True)
    (sweep / "notes" / "todo.txt").write_text("not a run")
    bad = shutil.copytree(runs["random"], tmp_path / "bad")
    (bad / "summary.json").write_text("[1, 2]")
    out = tmp_path / "site"
    assert view_main([str(bad), str(sweep), str(runs["random"]), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"skipped {bad}: {bad / 'summary.json'}: not a crl-bench summary" in err
    assert f"{sweep / 'notes'}: skipped: no summary.json" in err
    _go(page, out, "#/runs", "#build-problems")
    problems = page.locator("#build-problems").inner_text()
    assert str(bad) in problems and str(sweep / "notes") in problems
    assert page.locator("#runs-table tbody tr").count() == 2  # the sweep's oracle and the good random run



def test_the_experience_track_is_a_table_of_the_site_ranked_by_experience_gain(pg, size, board):
    from leaderboards.build import ROOT as BOARD
    from leaderboards.schema import load_submission

    page = pg
    _go(page, board, "", "table.leaderboard")
    track = page.locator("section.board", has=page.locator("h2", has_text="experience track"))
    assert track.count() == 1
    subs = [load_submission(p) for p in sorted((BOARD / "submissions").iterdir()) if p.is_dir()]
    streams = sorted((s for s in subs if "stream" in s["summary"]),
                     key=lambda s: -s["summary"]["stream"]["macro"]["experience_gain"])
    rows = track.locator("tbody tr")
    assert rows.count() == len(streams) > 0
    first = streams[0]["summary"]["stream"]["macro"]
    assert rows.first.locator("td.success").inner_text().startswith(f"+{100 * first['experience_gain']:.1f}")
    assert rows.first.locator("a.run-link").count() == 1  # the row opens the run (and its stream page)
    _in_view(page, rows.first.locator("td.success"), size[0])
