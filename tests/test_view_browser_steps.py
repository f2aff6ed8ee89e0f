"""The episode page's timeline, compact mode and in-episode search, compare, summary-only runs and breadcrumbs,
in a real browser (``pytest -m browser``).

The setup is :mod:`tests.test_view_browser`'s (Debian's Chromium driven by Playwright, pages opened from
``file://``); the runs are real Sokoban episodes played here, with made-up LLM turns and hostile text.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
pytest.importorskip("pytest_playwright", reason="pytest-playwright is not installed (pip install -e '.[test]')")

from eval.view import build_site  # noqa: E402
from tests import test_view_browser as B  # noqa: E402
from tests import view_fixtures as F  # noqa: E402

Watch, _open, _shot = B.Watch, B._open, B._shot
browser, context, page, watched = B.browser, B.context, B.page, B.watched  # the same Chromium and page fixtures
pytestmark = pytest.mark.browser
TASK = F.SOKOBAN
AGENTS = {"random": {"name": "random"}, "oracle": {"name": "oracle"}, "llm": {"name": "llm", "llm": {"model": "tiny"}},
          "hostile": {"name": "llm"}}


@pytest.fixture(scope="module")
def recs() -> dict[str, list[dict]]:
    return {"random": [F.play_sokoban(s, "random") for s in range(4)],
            "oracle": [F.play_sokoban(s, "oracle") for s in range(4)],
            "llm": F.llm_run_records(range(2)), "hostile": F.hostile_records()}


@pytest.fixture(scope="module")
def run_dirs(recs, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {name: F.write_run(root / name, recs[name], AGENTS[name]) for name in recs}


@pytest.fixture(scope="module")
def site(run_dirs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build_site(out, list(run_dirs.values()))
    return out


def _go(page, site: Path, hash_: str) -> None:
    """Open a page of the site with the last page's content gone first (a new hash re-renders a moment later)."""
    page.evaluate("() => { const app = document.getElementById('app'); if (app) app.textContent = ''; }")
    _open(page, site, hash_)


def _episode(page, site: Path, run: str, seed: int, extra: str = "") -> None:
    _go(page, site, f"#/episode?run={run}&task={TASK}&seed={seed}{extra}")
    page.wait_for_selector(".step")


def _kinds(steps: list[dict]) -> list[str]:
    """What each timeline mark should say: the step's validity, success, reward, then progress against the last."""
    out, before = [], None
    for s in steps:
        r, p = s["reward"], s["progress"]
        out.append("invalid" if not s["valid_action"] else "success" if s["success"] else "reward" if r > 0
                   else "penalty" if r < 0 else "plain" if before is None or p == before
                   else "progress" if p > before else "setback")
        before = p
    return out


def _map_cells(old: str, new: str) -> str:
    """The characters of ``new``'s map rows that differ from ``old``'s, in order."""
    rows = [(a, b) for a, b in zip(old.splitlines(), new.splitlines(), strict=True) if b and set(b) <= set("#_.$*@+")]
    return "".join(y for a, b in rows for x, y in zip(a, b, strict=True) if x != y)


def test_the_timeline_marks_each_step_by_what_it_did_and_a_click_jumps_there(watched, site, recs, output_path):
    page = watched
    seen = set()
    for run, seed in (("hostile", 1), ("oracle", 2), ("random", 1)):
        _episode(page, site, run, seed)
        kinds = page.eval_on_selector_all("[data-role=timeline] .mark", "ms => ms.map(m => m.dataset.kind)")
        assert kinds == _kinds(recs[run][seed]["steps"]), run
        seen |= set(kinds)
    assert {"invalid", "success", "progress", "setback", "plain"} <= seen

    _episode(page, site, "llm", 1)
    probs = page.eval_on_selector_all("[data-role=timeline] .mark", "ms => ms.map(m => Number(m.dataset.p))")
    turns = [s["turn"] for s in recs["llm"][1]["steps"]]
    assert probs == [round(t["candidates"][t["chosen"]]["prob"], 4) for t in turns]
    heights = page.eval_on_selector_all("[data-role=timeline] .mark .fill", "fs => fs.map(f => f.offsetHeight)")
    assert heights[probs.index(max(probs))] > heights[probs.index(min(probs))]
    assert "probability of the chosen action" in page.locator(".tl-legend").inner_text()
    _shot(page, output_path, "episode-timeline-llm")

    _episode(page, site, "random", 0)
    page.locator("[data-role=timeline] .mark[data-t='17']").click()
    assert page.locator(".step.current").get_attribute("id") == "step-17"
    assert "step=17" in page.evaluate("location.hash")
    assert page.locator("[data-role=timeline] .mark.current").get_attribute("data-t") == "17"
    bar = page.locator(".stepbar").bounding_box()
    box = page.locator("#step-17").bounding_box()
    assert bar["y"] + bar["height"] - 1 <= box["y"] < 900  # scrolled into view, below the sticky strip
    s = recs["random"][0]["steps"][17]
    assert page.locator("#step-17 .step-head .after").inner_text() == (
        f"after the action: reward {s['reward']:g} · progress " + (f"{s['progress']:.2f}" if s["progress"] % 1 else f"{s['progress']:g}"))


def test_long_episodes_open_compact_folding_repeated_lines_and_marking_what_changed(watched, site, recs, context,
                                                                                  output_path):
    page = watched
    steps = recs["random"][1]["steps"]
    t = next(t for t in range(1, len(steps)) if _map_cells(steps[t - 1]["observation"], steps[t]["observation"]))
    _episode(page, site, "random", 1, f"&step={t}")
    assert len(steps) >= 20 and page.locator("#view-mode").inner_text().startswith("show full text")
    pre = page.locator(f"#step-{t} pre.observation")
    goal = steps[t]["observation"].splitlines()[0]
    fold = pre.locator("button.fold")
    assert goal not in pre.inner_text() and f"as in step {t - 1}: Goal, " in fold.inner_text() and fold.get_attribute("title").startswith(goal)
    cells = "".join(pre.locator("span.chg").all_inner_texts())
    assert cells.startswith(_map_cells(steps[t - 1]["observation"], steps[t]["observation"])) and "@" in cells
    for row in steps[t]["observation"].splitlines()[1:7]:  # the map is shown whole
        assert row in pre.inner_text()
    _shot(page, output_path, "episode-compact")
    fold.click()
    assert pre.inner_text() == steps[t]["observation"] and "@" in "".join(pre.locator("span.chg").all_inner_texts())

    compact = page.evaluate("document.scrollingElement.scrollHeight")
    page.keyboard.press("c")
    assert compact < 0.8 * page.evaluate("document.scrollingElement.scrollHeight")  # a shorter page to scan
    assert page.locator(f"#step-{t} pre.observation").inner_text() == steps[t]["observation"]
    assert page.locator("button.fold").count() == 0 and page.locator("span.chg").count() == 0
    link = page.evaluate("location.href")
    assert "view=full" in link and f"step={t}" in link
    fresh = context.new_page()
    watch = Watch(fresh)
    fresh.goto(link)
    fresh.wait_for_selector(".step.current")
    assert fresh.locator("button.fold").count() == 0 and fresh.locator(".step.current").get_attribute("id") == f"step-{t}"
    assert watch.problems == []

    _episode(page, site, "oracle", 0)  # a short episode opens in full
    assert len(recs["oracle"][0]["steps"]) < 20 and page.locator("button.fold").count() == 0
    assert page.locator("#view-mode").inner_text().startswith("compact")


def test_search_marks_the_matched_words_and_n_jumps_to_the_next_match(watched, site, recs):
    page = watched
    rec, q = recs["random"][0], "bump into a wall"
    texts = [s["observation"] + "\n" + s["action"] for s in rec["steps"]]
    count = sum(x.lower().count(q) for x in texts) + rec["final_observation"].lower().count(q)
    with_hits = [t for t, x in enumerate(texts) if q in x.lower()]
    assert count >= 2
    _episode(page, site, "random", 0, "&q=Bump%20INTO%20a%20wall")
    hits = page.locator("mark.hit")
    assert hits.count() == count and {h.lower() for h in hits.all_inner_texts()} == {q}
    has_hit = page.eval_on_selector_all("[data-role=timeline] .mark.has-hit", "ms => ms.map(m => Number(m.dataset.t))")
    assert has_hit == with_hits
    assert page.locator(".step.current").get_attribute("id") == f"step-{with_hits[0]}"  # opened at the first match
    assert page.locator("mark.hit.current").count() == 1
    page.keyboard.press("n")
    assert page.locator("#hit-count").inner_text().startswith(f"match 2 of {count}")
    assert page.locator(".step.current").get_attribute("id") == f"step-{with_hits[1]}"
    assert f"step={with_hits[1]}" in page.evaluate("location.hash")
    assert page.locator("mark.hit.current").is_visible()
    page.keyboard.press("N")
    assert page.locator("#hit-count").inner_text().startswith(f"match 1 of {count}")

    page.keyboard.press("f")
    page.keyboard.type("targets")
    page.keyboard.press("Enter")
    total = sum(s["observation"].lower().count("targets") for s in rec["steps"]) + rec["final_observation"].lower().count("targets")
    page.wait_for_function(f"() => document.querySelectorAll('mark.hit').length === {total}")
    assert "q=targets" in page.evaluate("location.hash")

    # Matches in a panel opened later join n / N.
    _episode(page, site, "llm", 0, "&q=push%20all")
    shown = page.locator("mark.hit").count()
    page.locator("#step-0 details.messages summary").click()
    page.wait_for_function(f"() => document.querySelectorAll('mark.hit').length === {shown + 1}")
    page.keyboard.press("n")
    assert page.locator("#hit-count").inner_text().startswith(f"match 2 of {shown + 1}")

    # A match only in a collapsed panel (an experience entry) opens that panel.
    _episode(page, site, "llm", 0, "&q=away%20from%20corners")
    opened = page.locator(".step details.experience[open]")
    assert opened.count() == len(recs["llm"][0]["steps"])
    assert opened.first.locator("mark.hit").first.inner_text() == "away from corners"


def test_compare_reads_like_the_episode_page_with_its_keys_link_and_timelines(watched, site, recs, output_path):
    page = watched
    seed = 1
    _go(page, site, f"#/compare?a=random&b=oracle&task={TASK}&seed={seed}&step=3")
    page.wait_for_selector(".cmp-row.current")
    assert page.locator(".cmp-row.current").get_attribute("id") == "cmp-step-3"
    assert 0 <= page.locator("#cmp-step-3").bounding_box()["y"] < 900
    order = page.eval_on_selector_all("#cmp-step-3 .side", """ss => ss.map(s => {
        const o = s.querySelector('pre.observation'), a = s.querySelector('.act');
        return !!(o && a && (o.compareDocumentPosition(a) & Node.DOCUMENT_POSITION_FOLLOWING)); })""")
    assert order == [True, True]  # each side: the observation, then the action
    tops = page.eval_on_selector_all("#cmp-step-3 .side", "ss => ss.map(s => Math.round(s.getBoundingClientRect().top))")
    assert len(tops) == 2 and tops[0] == tops[1]  # one row: the sides scroll together
    page.keyboard.press("j")
    assert page.locator(".cmp-row.current").get_attribute("id") == "cmp-step-4" and "step=4" in page.evaluate("location.hash")
    page.keyboard.press("k")
    page.keyboard.press("k")
    assert page.locator(".cmp-row.current").get_attribute("id") == "cmp-step-2"
    timelines = page.locator("[data-role=timeline]")
    assert timelines.count() == 2
    assert timelines.nth(1).locator(".mark:not(.pad)").count() == len(recs["oracle"][seed]["steps"])
    xs = [timelines.nth(i).locator(".mark[data-t='6']").bounding_box()["x"] for i in (0, 1)]
    assert xs[0] == xs[1]  # the strips line up step by step
    timelines.nth(1).locator(".mark[data-t='6']").click()
    assert page.locator(".cmp-row.current").get_attribute("id") == "cmp-step-6"
    assert timelines.nth(0).locator(".mark.current").get_attribute("data-t") == "6"
    page.keyboard.press("c")
    assert page.locator("#cmp-step-6 .side").nth(0).locator("pre.observation").inner_text() == (
        recs["random"][seed]["steps"][6]["observation"])
    _shot(page, output_path, "compare-steps")
    page.keyboard.press("J")
    page.wait_for_function(f"() => location.hash.includes('seed={seed + 1}')")
    page.wait_for_selector(".cmp-row")
    page.keyboard.press("K")
    page.wait_for_function(f"() => location.hash.includes('seed={seed}')")

    for h in (f"#/compare?a=random&b=oracle&task={TASK}&seed=0", f"#/compare?a=hostile&b=llm&task={TASK}&seed=0"):
        _go(page, site, h)
        page.wait_for_selector(".cmp-row .side pre.observation")
        clipped = page.eval_on_selector_all(".side pre.observation", """ps => ps.filter(p =>
            p.scrollHeight > p.clientHeight + 1 || p.scrollWidth > p.clientWidth + 1).length""")
        assert clipped == 0, h  # every cell shows whole: no inner scroll
        assert page.evaluate("document.scrollingElement.scrollWidth") <= 1280, h


def test_a_summary_only_run_offers_no_empty_lists_and_compare_says_why_nothing_pairs(watched, run_dirs, tmp_path):
    page = watched
    summary_only = tmp_path / "submission"
    summary_only.mkdir()
    shutil.copy(run_dirs["random"] / "summary.json", summary_only / "summary.json")
    other = F.write_run(tmp_path / "other", F.hostile_records(env_id="crl/Sokoban-8x8-3-v0", seeds=range(1)), {"name": "llm"})
    out = tmp_path / "site"
    build_site(out, [summary_only, run_dirs["random"], other])
    _go(page, out, "#/run?run=submission")
    page.wait_for_selector("#summary-only")
    assert "summary only" in page.locator("#summary-only").inner_text()
    assert page.get_by_role("link", name="Episodes").count() == 0
    assert page.locator("main table.grid tbody a").count() == 0  # no task links to empty lists
    _go(page, out, "#/episodes?run=submission")
    page.wait_for_selector("#summary-only")
    assert page.locator("#episode-list").count() == 0
    _go(page, out, "#/compare?a=submission&b=random")
    page.wait_for_selector("#no-pairs")
    assert "summary only" in page.locator("#no-pairs").inner_text()
    assert page.locator("#pairs-table").count() == 0 and "All pairs" not in page.inner_text("main")
    assert "(summary only)" in page.eval_on_selector("#run-a", "s => s.selectedOptions[0].textContent")
    _go(page, out, "#/compare?a=random&b=other")
    page.wait_for_selector("#no-pairs")
    assert "share no task" in page.locator("#no-pairs").inner_text()


def test_breadcrumbs_always_belong_to_the_page_shown(watched, site):
    page = watched
    _episode(page, site, "random", 0)
    assert "Episodes" in page.locator("#crumbs").inner_text()
    for bad in ("#/run?run=nope", f"#/episode?run=random&task={TASK}&seed=999", "#/nowhere"):
        page.evaluate(f"location.hash = {bad!r}")
        page.wait_for_selector("main .error")
        crumbs = page.locator("#crumbs").inner_text()
        assert "Episodes" not in crumbs and "random" not in crumbs and "Error" in crumbs, bad
        _episode(page, site, "random", 0)
    page.evaluate("location.hash = '#/run?run=oracle'")
    page.wait_for_function("() => document.querySelector('#crumbs').innerText.includes('oracle')")
    assert "Episodes" not in page.locator("#crumbs").inner_text()
