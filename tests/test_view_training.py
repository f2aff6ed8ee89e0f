"""Training runs and unfinished runs in the viewer, in a real browser at 390×844 and 1280×800 (``pytest -m browser``).

The runs are real: two training runs of ``crl_agent.train`` with the tiny model (grpo, and crl with and without
experience; :mod:`tests.view_training`) in one tag folder, an ``eval.run`` killed with ``kill -9`` partway, and a
run that grows while ``python -m eval.view --watch`` rebuilds the site under an open page.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
pytest.importorskip("pytest_playwright", reason="pytest-playwright is not installed (pip install -e '.[test]')")
pytest.importorskip("peft")

from eval.trajectories import load_trajectories  # noqa: E402
from eval.view import build_site  # noqa: E402
from eval.view.__main__ import main as view_main  # noqa: E402
from tests import test_view_browser as B  # noqa: E402
from tests import view_fixtures as F  # noqa: E402
from tests.view_training import TASK, train_run  # noqa: E402

browser, context, page = B.browser, B.context, B.page  # the same Chromium, one per module
size, pg = B.size, B.pg  # each test at a phone's and a desktop's size, failing on any page error
pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("one_thread")]
SIZES = B.SIZES
ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def tag(tiny, tmp_path_factory) -> Path:
    """A trainer's tag folder of two real training runs (as benchmarks/train_cpu.py lays them out)."""
    root = tmp_path_factory.mktemp("train_cpu") / "tag"
    train_run(root / "grpo-seed0", tiny)
    train_run(root / "crl-seed0", tiny, mode="crl", steps=2, eval_every=1)
    return root


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    """A real eval.run killed with SIGKILL after some episodes landed: no summary.json."""
    out = tmp_path_factory.mktemp("killed") / "random-killed"
    proc = subprocess.Popen([sys.executable, "-m", "eval.run", "--agent", "random", "--tasks", F.SOKOBAN,
                             "--episodes", "500", "--out", str(out), "--quiet"], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            path = out / "episodes.jsonl"
            if path.exists() and len(path.read_bytes().splitlines()) >= 6:
                break
            assert proc.poll() is None, "eval.run ended before it was killed"
            time.sleep(0.1)
        else:
            pytest.fail("eval.run wrote fewer than 6 episodes in 240 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (out / "summary.json").exists()
    return out


@pytest.fixture(scope="module")
def site(tag, killed, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build_site(out, [tag, killed])
    return out


_go = B.go


def _evals(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "evals.jsonl").read_text().splitlines()]


def _fits(page, width: int) -> None:
    assert page.evaluate("document.scrollingElement.scrollWidth") <= width


def test_a_training_run_shows_its_learning_curve_and_each_evaluation_as_a_run(pg, size, site, tag):
    page, width = pg, size[0]
    evals = _evals(tag / "grpo-seed0")
    _go(page, site, "#/training?t=grpo-seed0", "#chart-success svg")
    first, last = evals[0]["success"], evals[-1]["success"]
    headline = page.locator("#headline")
    assert f"{100 * first:.1f}% → {100 * last:.1f}%" in headline.inner_text()
    box = headline.bounding_box()
    assert box["x"] + box["width"] <= width and box["y"] + box["height"] <= size[1]  # the number first, on screen
    # held-out success with its standard errors at each evaluation, training success at each step
    held = page.locator("#chart-success [data-series=success]")
    assert held.locator("circle.point").count() == len(evals)
    assert held.locator("line.whisker").count() == sum(1 for e in evals if e["success_se"] > 0)
    assert page.locator("#chart-success [data-series=train_success] polyline").count() == 1
    assert page.locator("#chart-entropy svg").count() == 1 and page.locator("#chart-kl svg").count() == 1
    assert page.locator("#chart-meta-reward").count() == 0  # grpo has no extractor
    # the cursor: a tap (or pointer) on the chart, then the step buttons; the values read out in words
    hit = page.locator("#chart-success .hit-area")
    hb = hit.bounding_box()
    page.mouse.click(hb["x"] + hb["width"] - 2, hb["y"] + hb["height"] / 2)
    readout = page.locator("#chart-success .readout")
    assert readout.inner_text().startswith(f"step {evals[-1]['step']}: held-out {100 * last:.1f}% ± ")
    page.locator("#cursor-prev").click()
    assert readout.inner_text().startswith("step 1: training rollouts ")
    assert page.locator("#chart-entropy .readout").inner_text().startswith("step 1: entropy ")
    # a legend entry switches its series off and on
    page.locator("#chart-success .legend-item").last.click()
    assert page.locator("#chart-success [data-series=train_success]").count() == 0
    _fits(page, width)
    # each evaluation is a run: its episodes, step by step
    page.locator("#evals-table a").last.click()
    page.wait_for_selector("#train-eval-note")
    assert f"step {evals[-1]['step']}" in page.locator("#train-eval-note").inner_text()
    assert [c.strip() for c in page.locator("#crumbs a, #crumbs span:not(.sep)").all_inner_texts()][:2] == ["Trainings", "grpo-seed0"]
    _go(page, site, "#/episodes?run=grpo-seed0-step-2", ".vrow")
    assert page.locator("#count").inner_text().startswith("4 of 4 episodes")
    page.locator(".vrow").first.click()
    page.wait_for_selector(".step")
    assert page.locator(".step").count() >= 1
    _fits(page, width)


def test_a_crl_training_shows_both_halves_and_the_extractor(pg, size, site, tag):
    page = pg
    rows = [json.loads(x) for x in (tag / "crl-seed0" / "metrics.jsonl").read_text().splitlines()]
    _go(page, site, "#/training?t=crl-seed0", "#chart-success svg")
    assert page.locator("#chart-success [data-series=with_experience] circle.point").count() == len(_evals(tag / "crl-seed0"))
    assert "with experience" in page.locator("#headline").inner_text()
    charts = {"extractor/updates": "#chart-extractor-updates", "extractor/meta_reward": "#chart-meta-reward",
              "extractor/valid_rate": "#chart-valid-ops"}
    for key, sel in charts.items():
        assert page.locator(sel).count() == int(any(key in r for r in rows)), key
    assert page.locator("#chart-valid-ops svg").count() == 1  # the tiny extractor's operations: some, valid or not
    # each half of each evaluation is its own run
    links = page.locator("#evals-table a").all_inner_texts()
    assert links.count("without") == links.count("with") == len(_evals(tag / "crl-seed0"))


def _first_difference(a: list[str], b: list[str]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_compare_puts_the_same_held_out_seed_at_step_0_and_2_side_by_side_and_jumps_to_the_first_difference(pg, size, site, tag):
    page = pg
    half = tag / "grpo-seed0" / "evals"
    before = {t["seed"]: [s["action"] for s in t["steps"]] for t in load_trajectories(half / "step-0000" / "without_experience")}
    after = {t["seed"]: [s["action"] for s in t["steps"]] for t in load_trajectories(half / "step-0002" / "without_experience")}
    differ = {s: _first_difference(before[s], after[s]) for s in before if before[s] != after[s]}
    assert differ, "two updates changed no held-out action: the fixture's learning rate is too low"
    _go(page, site, "#/training?t=grpo-seed0", "#compare-steps")
    page.locator("#compare-steps").click()
    page.wait_for_selector("#pairs-table")
    assert "a=grpo-seed0-step-0" in page.url and "b=grpo-seed0-step-2" in page.url
    assert page.locator("#pairs-table tbody tr").count() == 4
    seed, step = min(differ.items())
    _go(page, site, f"#/compare?a=grpo-seed0-step-0&b=grpo-seed0-step-2&task={TASK}&seed={seed}", "#divergence")
    assert page.locator("#divergence").inner_text().startswith(f"The actions first differ at step {step}.")
    page.locator("#goto-diff").click()
    page.wait_for_timeout(150)
    row = page.locator(f"#cmp-step-{step}")
    assert "current" in row.get_attribute("class") and "first-diff" in row.get_attribute("class")
    box = row.bounding_box()
    assert 0 <= box["y"] < size[1]


def test_a_tag_folder_shows_its_seeds_together(pg, size, tag, tmp_path):
    page = pg
    out = tmp_path / "site"
    build_site(out, [tag])
    _go(page, out, "", "#trainings-table")
    assert page.locator("#trainings-table tbody tr").count() == 2
    assert sorted(page.locator("#trainings-table tbody td:first-child").all_inner_texts()) == ["crl-seed0", "grpo-seed0"]
    assert page.locator("#chart-seeds .series").count() == 2
    gain = page.locator("#trainings-table tbody td.gain").first.bounding_box()
    assert gain["x"] + gain["width"] <= size[0]  # the first → last numbers in view without scrolling sideways
    _fits(page, size[0])


def test_a_killed_eval_opens_marked_incomplete_with_its_counts(pg, size, site, killed, tmp_path, capsys):
    page = pg
    # what is on disk: each recorded episode, and one whose trajectory landed just before the kill
    lines = [x for x in (killed / "episodes.jsonl").read_text().splitlines() if x.strip()]
    recorded = set()
    for x in lines:
        try:
            recorded.add(json.loads(x)["seed"])
        except json.JSONDecodeError:  # a line torn by the kill
            pass
    n = len(recorded | {t["seed"] for t in load_trajectories(killed)})
    _go(page, site, "#/runs", "#runs-table")
    row = page.locator("#runs-table tr", has_text="random-killed")
    assert row.locator(".badge.incomplete").count() == 1
    _go(page, site, "#/run?run=random-killed", "#incomplete-note")
    assert f"tallied from the {n} episodes on disk" in page.locator("#incomplete-note").inner_text()
    _go(page, site, "#/episodes?run=random-killed", ".vrow")
    assert page.locator("#count").inner_text().startswith(f"{n} of {n} episodes")
    page.locator(".vrow").first.click()
    page.wait_for_selector(".step")
    _fits(page, size[0])
    # the command line builds it too (it refused with exit 2 before)
    assert view_main([str(killed), "--out", str(tmp_path / "s")]) == 0


def _grow(run: Path, records: list[dict]) -> None:
    """Append episodes as eval.run does: trajectories first, then the episodes.jsonl lines."""
    with (run / "trajectories.jsonl.gz").open("ab") as f:
        for r in records:
            f.write(gzip.compress((json.dumps(r) + "\n").encode()))
    with (run / "episodes.jsonl").open("a") as f:
        for r in records:
            f.write(json.dumps({"env_id": r["env_id"], "seed": r["seed"], "sample": 0, **r["summary"]}) + "\n")


def test_watch_rebuilds_the_site_and_the_open_page_picks_up_new_episodes(pg, size, tmp_path):
    page = pg
    recs = [F.play_sokoban(s, "random", max_steps=8) for s in range(5)]
    run = F.write_run(tmp_path / "growing", recs[:2], {"name": "random"})
    (run / "summary.json").unlink()  # still running
    out = tmp_path / "site"
    # SIGINT as a terminal's Ctrl-C finds it: a suite started in the background (`cmd &`) inherits it ignored,
    # and a Python started with SIGINT ignored never raises KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "eval.view", str(run), "--out", str(out), "--watch", "0.3"],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not (out / "data" / "site.js").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() is not None else ""
            time.sleep(0.1)
        _go(page, out, "#/episodes?run=growing", ".vrow")
        assert page.locator("#count").inner_text().startswith("2 of 2 episodes")
        _grow(run, recs[2:])
        page.wait_for_function("() => /^5 of 5 episodes/.test((document.getElementById('count') || {}).textContent || '')",
                               timeout=20000)
        assert page.locator(".vrow").count() == 5
        assert "#/episodes?run=growing" in page.url  # the same page, reloaded with the new data
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0
    shutil.rmtree(out)
