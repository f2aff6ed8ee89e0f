"""The viewer in a real browser: Debian's Chromium driven by Playwright (``pytest -m browser``).

Pages are opened from ``file://`` as a person would open them; screenshots of each page go to
pytest-playwright's output folder (``test-results/`` unless ``--output`` says otherwise).
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
pytest.importorskip("pytest_playwright", reason="pytest-playwright is not installed (pip install -e '.[test]')")

from eval.trajectories import load_trajectories  # noqa: E402
from eval.view import build_site  # noqa: E402
from tests import view_fixtures as F  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.browser


SIZES = [(390, 844), (1280, 800)]  # a phone's and a desktop's viewport


@pytest.fixture(params=SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def size(request) -> tuple[int, int]:
    return request.param


@pytest.fixture
def pg(page, size):
    page.set_viewport_size({"width": size[0], "height": size[1]})
    watch = Watch(page)
    yield page
    assert watch.problems == []


def go(page, site: Path, hash_: str, wait: str = "main .page > *") -> None:
    """Open ``site`` at ``hash_`` and wait for ``wait`` to render."""
    page.goto((site / "index.html").as_uri() + hash_)
    page.wait_for_selector(wait)
    page.wait_for_timeout(150)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Debian's Chromium (never a downloaded one), one per test module, its profile and cache out of $HOME.

    Playwright's sync API keeps an event loop running in this thread while it is started, so it is stopped
    with the module: a test that runs after it in the same worker (eval.run's ``asyncio.run``) needs the
    thread back. (pytest-playwright's own ``browser`` lives for the whole session.)
    """
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium; make setup does it)")
    from playwright.sync_api import sync_playwright

    home = tmp_path_factory.mktemp("chromium-home")
    env = {**os.environ, "XDG_CONFIG_HOME": str(home), "XDG_CACHE_HOME": str(home)}
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, env=env)
        yield chromium
        chromium.close()


@pytest.fixture
def context(browser):
    ctx = browser.new_context()
    yield ctx
    ctx.close()


@pytest.fixture
def page(context):
    return context.new_page()


def _eval_run(agent: str, out: Path) -> Path:
    """A real run of ``agent`` on 6 Sokoban seeds (eval.run writes the trajectories the viewer reads)."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "eval.run", "--agent", agent, "--tasks", F.SOKOBAN, "--episodes", "6",
                    "--out", str(out), "--quiet"], check=True, cwd=root, env=env, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {"random": _eval_run("random", root / "random"), "oracle": _eval_run("oracle", root / "oracle"),
            "llm": F.write_run(root / "llm", F.llm_run_records(range(3)), {"name": "llm", "llm": {"model": "tiny"}}),
            "hostile": F.write_run(root / "hostile", F.hostile_records(), {"name": "llm"})}


@pytest.fixture(scope="module")
def site(runs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build_site(out, [runs["random"], runs["oracle"], runs["llm"], runs["hostile"]])
    return out


class Watch:
    """Everything a page did that it should not: dialogs, console errors, uncaught exceptions."""

    def __init__(self, page):
        self.problems: list[str] = []
        page.on("dialog", lambda d: (self.problems.append(f"dialog: {d.message}"), d.dismiss()))
        page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))


@pytest.fixture
def watched(page):
    page.set_viewport_size({"width": 1280, "height": 900})
    watch = Watch(page)
    yield page
    assert watch.problems == []


def _open(page, site: Path, hash_: str = "") -> None:
    page.goto((site / "index.html").as_uri() + hash_)


def _shot(page, output_path, name: str) -> None:
    Path(output_path).mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(Path(output_path) / f"{name}.png"))


def test_leaderboard_sorts_filters_and_opens_a_run(watched, runs, tmp_path, output_path):
    from leaderboards.build import ROOT
    from leaderboards.build import main as board_main

    page = watched
    subs = tmp_path / "subs"
    shutil.copytree(ROOT / "submissions", subs)
    sub = shutil.copytree(runs["oracle"], subs / "2026-12-04_oracle-steps")
    (sub / "metadata.yaml").write_text("name: oracle with steps\nmodel: none\nagent: oracle\ndate: '2026-12-04'\n"
                                       "url: ''\nverified: false\n")
    hostile = shutil.copytree(runs["random"], subs / "2026-12-05_hostile")
    (hostile / "metadata.yaml").write_text(yaml.safe_dump({
        "name": F.HOSTILE[0], "model": F.HOSTILE[1], "agent": F.HOSTILE[2], "date": F.HOSTILE[3], "url": "",
        "verified": True}))
    page.add_init_script("window.__pwned = undefined;")
    board = tmp_path / "board"
    assert board_main(["--submissions", str(subs), "--out", str(tmp_path / "b.md"), "--html", str(board)]) == 0
    _open(page, board)
    custom = page.locator("section.board", has_text="custom: crl/Sokoban-6x6-2-v0").first
    assert all(h in custom.inner_text() for h in F.HOSTILE[1:4]) and page.evaluate("window.__pwned") is None
    name = custom.locator("a.run-link", has_text="<script>")  # a short display name; the whole on hover
    assert name.get_attribute("title") == F.HOSTILE[0] and F.HOSTILE[0].startswith(name.inner_text().rstrip("…"))
    table = page.locator("section.board", has_text="task set 6").locator("table")
    names = table.locator("tbody tr td:nth-child(2) a.run-link")
    assert names.first.inner_text().startswith("oracle baseline")
    _shot(page, output_path, "leaderboard")
    table.get_by_role("button", name="macro success %").click()  # best first (descending)
    table.get_by_role("button", name="macro success %").click()  # then ascending
    assert names.first.inner_text().startswith("llm agent")
    assert "sort=macro" in page.evaluate("location.hash")
    page.select_option("#filter-agent", "random")
    # the two random rows of the task-set tables and the experience track's random row
    assert page.locator("tr.entry").count() == 3 and page.locator("tr.entry[data-agent=random]").count() == 3
    page.select_option("#filter-agent", F.HOSTILE[2])
    assert page.locator("tr.entry").count() == 1 and page.evaluate("window.__pwned") is None
    page.select_option("#filter-agent", "")
    before = page.locator("tr.entry").count()
    page.check("#filter-verified")
    assert page.locator("tr.entry").count() == before - 1  # the unverified submission is hidden
    page.uncheck("#filter-verified")
    page.get_by_role("link", name="oracle with steps").click()
    assert page.locator("h1").inner_text() == "oracle with steps"
    page.get_by_role("link", name=re.compile(r"Episodes \(6\)")).click()
    page.wait_for_selector(".vrow")
    assert page.locator("#count").inner_text().startswith("6 of 6")
    _shot(page, output_path, "submission-episodes")


def test_leaderboard_pages_fit_a_1280_window_with_short_names_and_frozen_columns(watched, runs, tmp_path, output_path):
    from leaderboards.build import ROOT
    from leaderboards.build import main as board_main

    page = watched
    subs = tmp_path / "subs"
    shutil.copytree(ROOT / "submissions", subs)
    long_name = ("llm agent with a deliberately long name that says everything about how it was run, "
                 "SmolLM2-135M + LoRA (seed 7, 40 steps; task set 6, 20 episodes per task, seeds 0-19)")
    task6 = next(d for d in sorted(subs.iterdir()) if d.name.endswith("_random-task6"))
    (shutil.copytree(task6, subs / "2026-12-06_long") / "metadata.yaml").write_text(yaml.safe_dump({
        "name": long_name, "model": "SmolLM2-135M-Instruct (a model description as long as a sentence can be)",
        "agent": "llm", "date": "2026-12-06", "url": "https://example.org/a/very/long/address", "verified": False}))
    for name, run in (("long-a", "oracle"), ("long-b", "random")):  # two long-named runs with episodes, to compare
        (shutil.copytree(runs[run], subs / f"2026-12-06_{name}") / "metadata.yaml").write_text(yaml.safe_dump({
            "name": f"{run} {long_name}", "model": "none", "agent": run, "date": "2026-12-06", "url": "", "verified": False}))
    board = tmp_path / "board"
    assert board_main(["--submissions", str(subs), "--out", str(tmp_path / "b.md"), "--html", str(board)]) == 0
    _open(page, board)
    section = page.locator("section.board", has_text="task set 6")
    link = section.locator("a.run-link", has_text="llm agent with a")
    assert link.get_attribute("title") == long_name and len(link.inner_text()) <= 45
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 1280
    _shot(page, output_path, "leaderboard-1280")
    ids = page.eval_on_selector_all("a.run-link", "as => as.map(a => new URLSearchParams(a.hash.split('?')[1]).get('run'))")
    names = page.eval_on_selector_all("a.run-link", "as => as.map(a => a.title)")
    a, b = ids[names.index(f"oracle {long_name}")], ids[names.index(f"random {long_name}")]
    for h in (f"#/run?run={a}", f"#/episodes?run={a}", f"#/compare?a={a}&b={b}",
              f"#/compare?a={a}&b={b}&task={F.SOKOBAN}&seed=0", f"#/episode?run={a}&task={F.SOKOBAN}&seed=0"):
        _open(page, board, h)
        page.wait_for_selector("main .page > *")
        page.wait_for_timeout(150)
        assert page.evaluate("document.scrollingElement.scrollWidth") <= 1280, h
        if "compare" in h:
            assert page.locator("#run-a").bounding_box()["width"] <= 0.4 * 1280 + 1, h

    page.set_viewport_size({"width": 900, "height": 900})  # narrower than the task-set-6 table: it scrolls inside
    _open(page, board)
    section = page.locator("section.board", has_text="task set 6")
    assert section.evaluate("s => s.scrollWidth > s.clientWidth")
    row = section.locator("tbody tr").first
    before = [row.locator("td").nth(i).bounding_box()["x"] for i in (0, 1, 8)]
    section.evaluate("s => { s.scrollLeft = 300; }")
    after = [row.locator("td").nth(i).bounding_box()["x"] for i in (0, 1, 8)]
    assert after[:2] == before[:2] and after[2] < before[2] - 250  # rank and name stay, the rest scrolls
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 900


def test_run_page_shows_per_task_results_chart_and_errors(watched, site, output_path):
    page = watched
    _open(page, site, "#/run?run=hostile")
    assert "Errored episodes (1)" in page.inner_text("main")
    assert page.locator(".chart .bar-row").count() == 1
    assert page.locator("ul.errors code").inner_text() == F.HOSTILE[1]
    _shot(page, output_path, "run")


def test_episode_list_filters_sorts_and_searches_every_step(watched, site, runs, output_path):
    page = watched
    trajs = load_trajectories(runs["random"])
    _open(page, site, "#/episodes?run=random")
    page.wait_for_selector(".vrow")
    assert page.locator("#count").inner_text().startswith(f"{len(trajs)} of {len(trajs)}")
    wins = sum(t["summary"]["success"] for t in trajs)
    page.select_option("#f-outcome", "success")
    page.wait_for_function(f"() => document.querySelector('#count').textContent.startsWith('{wins} of')")
    page.select_option("#f-outcome", "")
    # A phrase from one step in the middle of one episode only.
    target = trajs[2]["steps"][len(trajs[2]["steps"]) // 2]["observation"].splitlines()[-2]
    expected = sum(any(target.lower() in s["observation"].lower() for s in t["steps"]) for t in trajs)
    page.fill("#f-search", target.upper())
    page.wait_for_function("() => document.querySelector('#count').textContent.includes('containing')")
    assert page.locator("#count").inner_text().startswith(f"{expected} of")
    _shot(page, output_path, "episodes-search")
    page.fill("#f-search", "no such text anywhere in this run")
    page.wait_for_function("() => document.querySelector('#count').textContent.startsWith('0 of')")
    page.fill("#f-search", "")
    lengths = sorted(len(t["steps"]) for t in trajs)
    page.fill("#f-min", str(lengths[len(lengths) // 2]))
    page.wait_for_function(f"() => document.querySelector('#count').textContent.startsWith("
                           f"'{sum(n >= lengths[len(lengths) // 2] for n in lengths)} of')")
    page.fill("#f-min", "")
    page.select_option("#f-sort", "actions")
    page.select_option("#f-dir", "desc")
    page.wait_for_timeout(100)
    col = page.locator(".vhead > span").all_inner_texts().index("actions")  # columns that never change are left out
    first = page.locator(".vrow[data-pos='0'] > span").nth(col).inner_text()
    assert int(first) == lengths[-1]


def test_the_list_is_virtualised_and_scrolls_to_the_last_episode(watched, tmp_path):
    page = watched
    big = F.big_run(tmp_path / "big", episodes=3000, steps=2)
    out = tmp_path / "site"
    build_site(out, [big])
    _open(page, out, "#/episodes?run=big")
    page.wait_for_selector(".vrow")
    assert page.locator(".vrow").count() < 80  # only the rows in view exist
    page.locator("#episode-list").evaluate("el => { el.scrollTop = el.scrollHeight; }")
    page.wait_for_function("() => Array.from(document.querySelectorAll('.vrow')).some(r => r.dataset.pos === '2999')")
    assert page.locator(".vrow").count() < 80


def test_keys_step_through_an_episode_and_a_permalink_restores_the_step(watched, site, runs, context, output_path):
    page = watched
    _open(page, site, "#/episodes?run=llm")
    page.wait_for_selector(".vrow")
    page.locator(".vrow").nth(1).click()
    page.wait_for_selector(".step")
    for _ in range(3):
        page.keyboard.press("j")
    page.keyboard.press("k")
    page.keyboard.press("j")
    assert page.locator(".step.current").get_attribute("id") == "step-2"
    link = page.evaluate("location.href")
    assert "step=2" in link and "seed=1" in link
    page.locator(".step.current details.messages summary").click()
    assert page.locator(".step.current .message .role").first.inner_text() == "system"
    assert page.locator(".step.current table.candidates tr.chosen").count() == 1
    page.locator(".step.current details.experience summary").click()
    assert "Push boxes away from corners" in page.locator(".step.current .exp-title").inner_text()
    assert "where is the nearest target?" in page.locator(".step.current .qa").inner_text()
    _shot(page, output_path, "episode")
    page.keyboard.press("?")
    assert page.locator("#help").is_visible()
    page.keyboard.press("Escape")
    assert not page.locator("#help").is_visible()
    page.keyboard.press("J")
    page.wait_for_function("() => location.hash.includes('seed=2')")
    page.keyboard.press("K")
    page.wait_for_function("() => location.hash.includes('seed=1')")

    fresh = context.new_page()
    watch = Watch(fresh)
    fresh.goto(link)
    fresh.wait_for_selector(".step.current")
    assert fresh.locator(".step.current").get_attribute("id") == "step-2"
    assert fresh.locator("#step-2").is_visible() and fresh.locator("h1").inner_text().endswith("seed 1")
    box = fresh.locator("#step-2").bounding_box()
    assert 0 <= box["y"] < 900
    fresh.keyboard.press("/")
    fresh.wait_for_function("() => document.activeElement && document.activeElement.id === 'f-search'")
    assert watch.problems == []


def test_compare_random_and_oracle_marks_the_first_divergence(watched, site, runs, output_path):
    page = watched
    ra = {t["seed"]: t for t in load_trajectories(runs["random"])}
    ob = {t["seed"]: t for t in load_trajectories(runs["oracle"])}
    split = [s for s in ra if ra[s]["summary"]["success"] != ob[s]["summary"]["success"]]
    _open(page, site, "#/compare?a=random&b=oracle")
    page.wait_for_selector("#pairs-table")
    assert page.locator("#pairs-table tbody tr").count() == len(ra)
    assert page.locator("#split-table tbody tr").count() == len(split)
    _shot(page, output_path, "compare-overview")
    seed = split[0]
    acts_a = [s["action"] for s in ra[seed]["steps"]]
    acts_b = [s["action"] for s in ob[seed]["steps"]]
    first = next((t for t, (x, y) in enumerate(zip(acts_a, acts_b, strict=False)) if x != y), min(len(acts_a), len(acts_b)))
    page.locator("#split-table tbody tr").nth(0).get_by_role("link").click()
    page.wait_for_selector("#divergence")
    assert page.locator("#divergence").inner_text().startswith(f"The actions first differ at step {first}.")
    row = page.locator(".cmp-row.first-diff")
    assert row.count() == 1 and row.get_attribute("id") == f"cmp-step-{first}"
    assert row.locator("code.action").all_inner_texts() == [acts_a[first], acts_b[first]]
    assert row.is_visible()
    _shot(page, output_path, "compare")


def test_hostile_text_shows_literally_and_nothing_executes(watched, site, output_path):
    page = watched
    page.add_init_script("window.__pwned = undefined;")
    pages = ["#/run?run=hostile", "#/episodes?run=hostile",
             "#/episode?run=hostile&task=crl/Sokoban-6x6-2-v0&seed=0&step=1",
             "#/episode?run=hostile&task=crl/Sokoban-6x6-2-v0&seed=1",
             "#/compare?a=hostile&b=llm&task=crl/Sokoban-6x6-2-v0&seed=0"]
    for h in pages:
        _open(page, site, h)
        page.wait_for_selector("main .page > *")
        page.wait_for_timeout(100)
        for d in page.locator("details summary").all()[:30]:
            d.click()
        assert page.evaluate("window.__pwned") is None, h
        assert page.locator("main img, main svg, main iframe, main script").count() == 0, h
        hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
        assert all(h.startswith(("#", "http://", "https://")) for h in hrefs), hrefs
    text = page.inner_text("main")
    for h in F.HOSTILE[:6]:
        assert h in text
    _open(page, site, "#/episode?run=hostile&task=crl/Sokoban-6x6-2-v0&seed=1&view=compact&q=%3Cscript%3E")
    page.wait_for_selector("mark.hit")
    assert set(page.locator("mark.hit").all_inner_texts()) == {"<script>"}  # matches marked, as text
    assert page.evaluate("window.__pwned") is None and page.locator("main img, main svg, main script").count() == 0
    _open(page, site, pages[2])
    page.wait_for_selector(".step.current")
    info = page.locator("#step-0 details.info")
    info.evaluate("d => { d.open = true; }")  # opened, whether or not an earlier click already had it open
    page.wait_for_function("() => document.querySelector('#step-0 details.info').innerText.includes('__proto__')",
                           timeout=10_000)
    assert '"__proto__"' in info.inner_text()  # a key, not a prototype
    assert page.evaluate("({}).polluted") is None
    big = page.locator("#step-1 pre.observation")
    assert len(big.inner_text()) <= 20_001 and page.locator("#step-1 button.more").count() >= 1
    start = time.monotonic()
    page.keyboard.press("j")
    assert page.locator(".step.current").get_attribute("id") == "step-2"
    assert time.monotonic() - start < 5, "the page stopped responding"
    page.locator("#step-1 button.more").first.click()
    assert F.BIG_LINE in page.locator("#step-1 pre.observation").inner_text()
    page.fill("#f-search", "") if page.locator("#f-search").count() else None
    _open(page, site, "#/episodes?run=hostile&q=" + "%3Cscript%3E")
    page.wait_for_function("() => document.querySelector('#count').textContent.includes('containing')")
    assert page.locator("#count").inner_text().startswith("2 of 2")
    assert page.evaluate("window.__pwned") is None
    _shot(page, output_path, "hostile")


def test_the_content_security_policy_blocks_inline_script(page, site):
    messages = []
    page.on("console", lambda m: messages.append(m.text))
    _open(page, site)
    page.wait_for_selector("main .page > *")
    page.evaluate("""() => {
        const s = document.createElement('script'); s.textContent = 'window.__inline = 1'; document.body.appendChild(s);
        const b = document.createElement('button'); b.setAttribute('onclick', 'window.__handler = 1');
        document.body.appendChild(b); b.click();
    }""")
    assert page.evaluate("[window.__inline, window.__handler]") == [None, None]
    assert any("Content Security Policy" in m for m in messages), messages


def test_the_site_also_works_from_a_static_server(watched, site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        watched.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html#/episode?run=oracle"
                     "&task=crl/Sokoban-6x6-2-v0&seed=0&step=1")
        watched.wait_for_selector(".step.current")
        assert watched.locator(".step.current").get_attribute("id") == "step-1"
    finally:
        server.shutdown()
        server.server_close()


def test_a_site_copied_without_its_data_says_what_is_missing(page, site, tmp_path):
    shutil.copy(site / "index.html", tmp_path / "index.html")
    shutil.copytree(site / "assets", tmp_path / "assets")
    page.goto((tmp_path / "index.html").as_uri())
    assert "data/site.js) did not load" in page.locator("main .error").inner_text()
