"""The viewer at a phone's width (390×844) and a desktop's (1280×800), in a real browser (``pytest -m browser``).

Each test runs at both sizes. The setup is :mod:`tests.test_view_browser`'s (Debian's Chromium driven by
Playwright, one browser per module, pages opened from ``file://``). The runs are real Sokoban episodes
played here, with made-up LLM turns, plus damaged runs: a torn ``episodes.jsonl`` line, a cut-off trajectories
file and an empty ``episodes.jsonl``.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
pytest.importorskip("pytest_playwright", reason="pytest-playwright is not installed (pip install -e '.[test]')")

from eval.view import build_site  # noqa: E402
from tests import test_view_browser as B  # noqa: E402
from tests import view_fixtures as F  # noqa: E402

browser, context, page = B.browser, B.context, B.page  # the same Chromium, one per module
size, pg = B.size, B.pg  # each test at a phone's and a desktop's size, failing on any page error
pytestmark = pytest.mark.browser
TASK = F.SOKOBAN
SIZES = B.SIZES
FIRST_DIFF = 4


def _llm_records() -> list[dict]:
    """LLM episodes whose turns carry what the llm agent records in score mode (temperature, log p(action))."""
    recs = F.llm_run_records(range(2))
    for r in recs:
        for s in r["steps"]:
            turn = s["turn"]
            turn.update(temperature=0.7, score_norm="sum",
                        action_logprob=math.log(turn["candidates"][turn["chosen"]]["prob"]))
    return recs


def _word_records() -> list[dict]:
    """One short episode whose message line changes one word for another ("right" to "left")."""
    board = "######\n#_@_.#\n######"
    steps = [{"t": t, "observation": f"{board}\nLast move: {m}.\nActions: up, down, left, right",
              "admissible_actions": ["up", "down", "left", "right"], "action": a, "reward": 0.0, "valid_action": True,
              "terminated": False, "truncated": t == 1, "success": False, "progress": 0.0, "info": {}, "turn": None}
             for t, (m, a) in enumerate([("right", "left"), ("left", "up")])]
    return [F._record(TASK, 0, "random", "Push all boxes onto the targets.", steps, board, {
        "success": False, "progress": 0.0, "reward": 0.0, "actions": 2, "invalid_actions": 0, "terminated": False,
        "truncated": True, "wall_time_s": 0.01, "error": None, "tokens_in": 0, "tokens_out": 0, "extra": {}})]


def _shifted(recs: list[dict]) -> list[dict]:
    """The oracle's episodes with one action changed at step FIRST_DIFF of seed 1 (a pair that differs late)."""
    out = copy.deepcopy(recs)
    out[1]["steps"][FIRST_DIFF]["action"] = "wait"
    return out


def damage(run: Path) -> None:
    """Tear the second line of ``episodes.jsonl`` and cut the trajectories file inside its last record."""
    lines = (run / "episodes.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1][: len(lines[1]) // 2] + "\n"
    (run / "episodes.jsonl").write_text("".join(lines))
    gz = run / "trajectories.jsonl.gz"
    data = gz.read_bytes()
    gz.write_bytes(data[: len(data) - 40])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    oracle = [F.play_sokoban(s, "oracle") for s in range(3)]
    out = {
        "random": F.write_run(root / "random", [F.play_sokoban(s, "random") for s in range(3)], {"name": "random"}),
        "oracle": F.write_run(root / "oracle", oracle, {"name": "oracle"}),
        "llm": F.write_run(root / "llm", _llm_records(), {"name": "llm", "llm": {"model": "tiny"}}),
        "long": F.write_run(root / "long", [F.play_sokoban(5, "random", max_steps=100)], {"name": "random"}, seed=5),
        "shifted": F.write_run(root / "shifted", _shifted(oracle), {"name": "oracle"}),
        "words": F.write_run(root / "words", _word_records(), {"name": "random"}),
        "damaged": F.write_run(root / "damaged", [F.play_sokoban(s, "random") for s in range(3)], {"name": "random"}),
        "empty": F.write_run(root / "empty", [F.play_sokoban(0, "random")], {"name": "random"}),
    }
    damage(out["damaged"])
    (out["empty"] / "episodes.jsonl").write_text("")
    (out["empty"] / "trajectories.jsonl.gz").unlink()
    return out


@pytest.fixture(scope="module")
def site(runs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build_site(out, list(runs.values()))
    return out


@pytest.fixture(scope="module")
def board(runs, tmp_path_factory) -> Path:
    """The leaderboard site: the shipped submissions plus one with episodes and a very long name."""
    from leaderboards.build import ROOT
    from leaderboards.build import main as board_main

    tmp = tmp_path_factory.mktemp("board")
    subs = tmp / "subs"
    shutil.copytree(ROOT / "submissions", subs)
    (shutil.copytree(runs["oracle"], subs / "2026-12-06_phone") / "metadata.yaml").write_text(yaml.safe_dump({
        "name": "oracle with a long name that goes on to say how it was run (seed 7, 40 steps, task set 6)",
        "model": "none", "agent": "oracle", "date": "2026-12-06", "url": "", "verified": False}))
    assert board_main(["--submissions", str(subs), "--out", str(tmp / "b.md"), "--html", str(tmp / "site")]) == 0
    return tmp / "site"


def _go(page, site: Path, hash_: str, wait: str = "main .page > *") -> None:
    page.evaluate("() => { const app = document.getElementById('app'); if (app) app.textContent = ''; }")
    page.goto((site / "index.html").as_uri() + hash_)
    page.wait_for_selector(wait)
    page.wait_for_timeout(150)


def _width(page) -> int:
    return page.evaluate("document.scrollingElement.scrollWidth")


def test_no_page_is_wider_than_the_window_and_wide_tables_scroll_in_their_box(pg, size, site, board):
    page, width = pg, size[0]
    for h in ("#/runs", "#/run?run=llm", "#/run?run=damaged", "#/episodes?run=random", f"#/episode?run=llm&task={TASK}&seed=0",
              f"#/episode?run=long&task={TASK}&seed=5", "#/compare?a=random&b=oracle",
              f"#/compare?a=llm&b=random&task={TASK}&seed=0", f"#/compare?a=random&b=oracle&task={TASK}&seed=1"):
        _go(page, site, h)
        assert _width(page) <= width, h
    for h in ("#/", "#/runs", "#/run?run=2026-12-06-phone", "#/episodes?run=2026-12-06-phone",
              f"#/episode?run=2026-12-06-phone&task={TASK}&seed=0"):
        _go(page, board, h)
        assert _width(page) <= width, f"leaderboard site {h}"

    _go(page, site, "#/run?run=llm")
    box = page.locator("#task-table")
    if box.evaluate("b => b.scrollWidth > b.clientWidth"):  # too wide for the window: it scrolls, the task stays
        first = box.locator("tbody tr").first.locator("td").first
        x = first.bounding_box()["x"]
        box.evaluate("b => { b.scrollLeft = 200; }")
        assert first.bounding_box()["x"] == x
        assert box.locator("tbody tr").first.locator("td").nth(2).bounding_box()["x"] < width
    else:
        assert width > 640


def test_episode_list_headers_sit_over_their_columns_and_no_value_is_cut(pg, size, site, runs):
    page = pg
    _go(page, site, "#/episodes?run=random", ".vrow")
    heads = page.eval_on_selector_all(".vhead > span", "ss => ss.map(s => { const r = s.getBoundingClientRect(); "
                                      "return [r.left, r.right, s.scrollWidth <= s.clientWidth]; })")
    assert all(h[2] for h in heads), heads  # no header cut either
    list_box = page.locator("#episode-list").bounding_box()
    for row in page.locator(".vrow").all():
        cells = row.evaluate("r => Array.from(r.children).map(c => { const b = c.getBoundingClientRect(); "
                             "return [(b.left + b.right) / 2, c.scrollWidth <= c.clientWidth, c.textContent]; })")
        assert len(cells) == len(heads)
        for (left, right, _), (cx, whole, txt) in zip(heads, cells, strict=True):
            if cx < list_box["x"] + list_box["width"]:  # a column scrolled out of the box's view is not compared
                assert left <= cx <= right, (heads, cells)
            assert whole, f"{txt!r} is cut"
    # 3 episodes: the box is as tall as its rows, not the window.
    assert list_box["height"] <= 4 * 28 + 4
    # A narrow screen scrolls head and rows sideways together; the task column stays in view.
    lst = page.locator("#episode-list")
    if lst.evaluate("l => l.scrollWidth > l.clientWidth"):
        before = page.locator(".vrow").first.locator("span").first.bounding_box()["x"]
        head_x = page.locator(".vhead > span").nth(4).bounding_box()["x"]
        lst.evaluate("l => { l.scrollLeft = 150; }")
        assert page.locator(".vrow").first.locator("span").first.bounding_box()["x"] == before
        assert page.locator(".vhead > span").nth(4).bounding_box()["x"] == head_x - 150


def test_episode_sort_keeps_seed_order_among_ties_in_both_directions(pg, site):
    page = pg
    _go(page, site, "#/episodes?run=random", ".vrow")
    eps = [{"i": i, "env": TASK, "outcome": "failure", "actions": a} for i, a in enumerate([5, 3, 5, 3, 5])]
    for d, want in (("", [1, 3, 0, 2, 4]), ("desc", [0, 2, 4, 1, 3])):
        got = page.evaluate("([eps, d]) => CRLVIEW.filterEpisodes(eps, {sort: 'actions', dir: d}).map(e => e.i)", [eps, d])
        assert got == want, d


def test_compare_stacks_the_sides_on_a_phone_with_a_short_bar_and_readable_numbers(pg, size, site):
    page, (width, height) = pg, size
    _go(page, site, f"#/compare?a=llm&b=random&task={TASK}&seed=0", ".cmp-row")
    bar = page.locator(".compare-bar").bounding_box()
    assert bar["height"] <= 0.25 * height, bar
    sides = page.locator("#cmp-step-1 .side")
    a, b = sides.nth(0).bounding_box(), sides.nth(1).bounding_box()
    if width < 640:
        assert b["y"] >= a["y"] + a["height"] - 1 and b["width"] >= 0.8 * width  # stacked, each the full width
    else:
        assert a["y"] == b["y"] and b["x"] >= a["x"] + a["width"]  # side by side
    for cell in page.locator("#cmp-step-1 table.candidates td.num").all():
        box = cell.bounding_box()
        assert cell.evaluate("c => c.scrollWidth <= c.clientWidth") and box["height"] < 24, cell.inner_text()
    # The first-difference badge stays inside its own column.
    row = page.locator(".cmp-row.first-diff")
    badge, col = row.locator(".badge.diverge").bounding_box(), row.locator(".cmp-t").bounding_box()
    side_a = row.locator(".side").first.bounding_box()
    assert badge["x"] + badge["width"] <= col["x"] + col["width"] + 0.5
    assert badge["x"] + badge["width"] <= side_a["x"] + 0.5 or badge["y"] + badge["height"] <= side_a["y"] + 0.5


def test_compare_opens_at_the_top_with_the_first_difference_marked_and_d_goes_there(pg, size, site, runs):
    page = pg
    _go(page, site, f"#/compare?a=oracle&b=shifted&task={TASK}&seed=1", ".cmp-row.current")
    first = FIRST_DIFF
    assert page.locator("#divergence").inner_text().startswith(f"The actions first differ at step {first}.")
    assert page.evaluate("window.scrollY") == 0
    header = page.locator("#top").bounding_box()
    for sel in ("main h1", "#run-a", "#run-b"):
        box = page.locator(sel).bounding_box()
        assert header["y"] + header["height"] <= box["y"] and box["y"] + box["height"] <= size[1], sel
    assert page.locator(".cmp-row.current").get_attribute("id") == f"cmp-step-{first}"
    assert f"step={first}" in page.evaluate("location.hash")  # the address names the step at once
    page.keyboard.press("d")
    page.wait_for_timeout(100)
    row = page.locator(f"#cmp-step-{first}").bounding_box()
    bar = page.locator(".compare-bar").bounding_box()
    assert bar["y"] + bar["height"] - 1 <= row["y"] < size[1]


def test_a_damaged_run_says_what_was_lost(pg, site, runs):
    page = pg
    _go(page, site, "#/run?run=damaged", "#run-warnings")
    text = page.locator("#run-warnings").inner_text()
    assert f"{runs['damaged'] / 'episodes.jsonl'}:2: not valid JSON" in text
    assert "trajectories.jsonl.gz" in text and "counts 3 episodes" in text
    _go(page, site, f"#/episode?run=damaged&task={TASK}&seed=2", "#no-trajectory")
    note = page.locator("#no-trajectory").inner_text()
    assert "cut off" in note and "No trajectory was recorded" not in note
    _go(page, site, "#/run?run=empty", "#summary-only")
    note = page.locator("#summary-only").inner_text()
    assert "episodes.jsonl is empty" in note and "no episodes.jsonl" not in note
    _go(page, site, "#/run?run=random")
    assert page.locator("#run-warnings").count() == 0


def test_llm_numbers_are_labelled_with_what_they_are(pg, site):
    page = pg
    _go(page, site, f"#/episode?run=llm&task={TASK}&seed=0", ".step table.candidates")
    step = page.locator("#step-0")
    prob = step.locator("th.c-prob")
    logprob = step.locator("th.c-logprob")
    assert prob.inner_text() == "prob" and "temperature 0.70" in prob.get_attribute("title")
    assert "log" in logprob.inner_text() and "exp(" in logprob.get_attribute("title")
    assert "summed" in logprob.get_attribute("title")
    meta = step.locator(".turn-meta span.q-label")
    assert meta.inner_text().startswith("log p(action)") and "chosen candidate's prob" in meta.get_attribute("title")


def test_compact_mode_marks_whole_words(pg, site):
    page = pg
    _go(page, site, f"#/episode?run=words&task={TASK}&seed=0&view=compact", "#step-1 pre.observation")
    assert page.locator("#step-1 span.chg").all_inner_texts() == ["left"]


def test_a_long_timeline_wraps_into_rows_of_equal_marks(pg, size, site):
    page = pg
    _go(page, site, f"#/episode?run=long&task={TASK}&seed=5", "[data-role=timeline] .mark")
    boxes = page.eval_on_selector_all("[data-role=timeline] .mark", "ms => ms.map(m => { const r = m.getBoundingClientRect(); "
                                      "return [r.width, r.top]; })")
    assert len(boxes) == 100
    widths = [b[0] for b in boxes]
    assert max(widths) - min(widths) < 0.5 and min(widths) >= 3, (min(widths), max(widths))
    assert _width(page) <= size[0]


def test_breadcrumbs_show_whole_short_names(pg, site):
    page = pg
    _go(page, site, f"#/episode?run=random&task={TASK}&seed=0", ".step")
    crumbs = page.eval_on_selector_all("#crumbs > a, #crumbs > span:not(.sep)",
                                       "cs => cs.map(c => [c.textContent, c.scrollWidth <= c.clientWidth])")
    assert [c[0] for c in crumbs] == ["random [random]", "Episodes", "Sokoban-6x6-2 #0"]
    assert all(c[1] for c in crumbs), crumbs


def test_site_json_names_damage_for_the_page(site):
    manifest = (site / "data" / "site.js").read_text()
    data = json.loads(json.loads(manifest.split("JSON.parse(", 1)[1].rsplit("));", 1)[0]))
    by_id = {r["id"]: r for r in data["runs"]}
    assert by_id["damaged"]["trajectories_file"] == "cut" and by_id["empty"]["episodes_file"] == "empty"
    assert by_id["random"]["warnings"] == [] and by_id["random"]["episodes_file"] == "present"
