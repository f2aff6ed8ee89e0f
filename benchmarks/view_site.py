"""The viewer's speed on a large run: 5,000 episodes x 30 steps, in headless Chromium.

Targets (issue 16): the run's episode list opens in <= 2 s, an episode opens in <= 200 ms, the list is
virtualised (a few dozen rows exist however many episodes). Each time is also shown as a ratio against
the same measurement on a one-episode site in the same browser (the page's fixed cost), so a slow machine
shows up as a slow baseline rather than as a slow viewer. Timings on a shared 2-core machine are noisy.

Run: ``python benchmarks/view_site.py [--episodes 5000] [--steps 30] [--docs DIR]``
(``--docs DIR`` also saves the README's two screenshots, episode.png and compare.png, into DIR.)
Needs Debian's chromium at /usr/bin/chromium and the ``playwright`` package.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eval.view import build_site  # noqa: E402
from tests import view_fixtures as F  # noqa: E402

CHROMIUM = "/usr/bin/chromium"

# Time from navigation start until a condition holds, measured inside the page.
OPEN_LIST = """async () => {
  while (!document.querySelector('.vrow')) await new Promise(r => requestAnimationFrame(r));
  return performance.now();
}"""
OPEN_EPISODE = """async ([list, hash]) => {
  location.hash = list;  // from the episode list, as a person clicks a row
  while (!document.querySelector('.vrow')) await new Promise(r => setTimeout(r, 1));
  const t0 = performance.now();
  location.hash = hash;
  const want = new URLSearchParams(hash.split('?')[1]).get('seed');
  while (!(document.querySelector('.step') && (document.querySelector('h1') || {}).textContent.endsWith('seed ' + want)))
    await new Promise(r => setTimeout(r, 1));
  return performance.now() - t0;
}"""
SEARCH = """async (q) => {
  const box = document.querySelector('#f-search');
  const t0 = performance.now();
  box.value = q; box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));
  while (!document.querySelector('#count').textContent.includes('containing')) await new Promise(r => setTimeout(r, 1));
  return performance.now() - t0;
}"""
SCROLL = """async () => {
  const list = document.querySelector('#episode-list'), times = [];
  for (let i = 1; i <= 40; i++) {
    const t0 = performance.now();
    list.scrollTop = list.scrollHeight * (i % 2 ? i : 40 - i) / 40;
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  const small = [];  // a wheel-like scroll: 3 rows a frame
  list.scrollTop = 0;
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  let last = performance.now();
  for (let i = 1; i <= 60; i++) {
    list.scrollTop += 84;
    await new Promise(r => requestAnimationFrame(r));
    const now = performance.now(); small.push(now - last); last = now;
  }
  small.sort((a, b) => a - b);
  return [times[times.length >> 1], times[times.length - 1], small[small.length >> 1], small[small.length - 1],
          document.querySelectorAll('.vrow').length];
}"""


def site_size(out: Path) -> tuple[int, dict[str, int], int]:
    files = [p for p in out.rglob("*") if p.is_file()]
    kinds: dict[str, int] = {}
    for p in files:
        kind = p.name.split("-")[0].split(".")[0] if p.parent.parent.name == "data" else p.parent.name or "root"
        kinds[kind] = kinds.get(kind, 0) + p.stat().st_size
    return sum(p.stat().st_size for p in files), kinds, len(files)


def measure(page, out: Path, run_id: str, episodes: list[tuple[str, int]]) -> dict[str, float]:
    page.goto("about:blank")  # a real load each time, not a same-document hash change
    page.goto((out / "index.html").as_uri() + f"#/episodes?run={run_id}")
    open_ms = page.evaluate(OPEN_LIST)
    ep_ms = [page.evaluate(OPEN_EPISODE, [f"#/episodes?run={run_id}", f"#/episode?run={run_id}&task={env}&seed={seed}"])
             for env, seed in episodes]
    page.goto("about:blank")
    page.goto((out / "index.html").as_uri() + f"#/episodes?run={run_id}")
    page.evaluate(OPEN_LIST)
    frame_median, frame_max, wheel_median, wheel_max, rows = page.evaluate(SCROLL)
    first_search = page.evaluate(SEARCH, "step 7 token0.5")
    again = page.evaluate(SEARCH, "episode 12 step")
    return {"open": open_ms, "episode_median": statistics.median(ep_ms), "episode_max": max(ep_ms),
            "scroll_frame_median": frame_median, "scroll_frame_max": frame_max,
            "wheel_median": wheel_median, "wheel_max": wheel_max, "rows": rows, "search_first": first_search, "search_again": again}


def screenshots(browser, docs: Path, tmp: Path) -> None:
    import subprocess

    root = tmp / "docs-runs"
    repo = Path(__file__).resolve().parent.parent
    rand, orac = root / "random", root / "oracle"
    for agent, out in (("random", rand), ("oracle", orac)):  # real runs
        subprocess.run([sys.executable, "-m", "eval.run", "--agent", agent, "--tasks", F.SOKOBAN, "--episodes", "6",
                        "--out", str(out), "--quiet"], check=True, cwd=repo, capture_output=True)
    # Real Sokoban steps with a made-up LLM trace (no model runs here), labelled as such.
    llm = F.write_run(root / "llm", F.llm_run_records(range(3)), {"name": "llm", "llm": {"model": "example trace"}})
    out = tmp / "docs-site"
    build_site(out, [rand, orac, llm])
    page = browser.new_page(viewport={"width": 1100, "height": 760})
    page.goto((out / "index.html").as_uri() + "#/episode?run=llm&task=crl/Sokoban-6x6-2-v0&seed=1")
    page.wait_for_selector(".step")
    docs.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(docs / "viewer-episode.png"))
    # The seed where random and oracle agree longest before their actions part.
    from eval.view.data import load_trajectories

    a = {t["seed"]: [s["action"] for s in t["steps"]] for t in load_trajectories(rand)}
    b = {t["seed"]: [s["action"] for s in t["steps"]] for t in load_trajectories(orac)}
    def first(s: int) -> int:
        return next((i for i, (x, y) in enumerate(zip(a[s], b[s], strict=False)) if x != y), 0)

    seed = max(a, key=first)
    page.set_viewport_size({"width": 1100, "height": 1000})
    page.goto((out / "index.html").as_uri() + f"#/compare?a=random&b=oracle&task=crl/Sokoban-6x6-2-v0&seed={seed}")
    page.wait_for_selector("tr.first-diff")
    if first(seed) <= 2:  # the whole story fits with the page's header
        page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(docs / "viewer-compare.png"))
    page.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=5000)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--docs", type=Path, help="also save the README screenshots here")
    args = p.parse_args()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("skipped: playwright is not installed (pip install -e '.[test]')")
        return 0
    if not Path(CHROMIUM).exists():
        print(f"skipped: {CHROMIUM} is missing (apt-get install chromium)")
        return 0
    with tempfile.TemporaryDirectory(prefix="crl-view-bench-") as tmp_s:
        tmp = Path(tmp_s)
        t0 = time.perf_counter()
        big = F.big_run(tmp / "big", episodes=args.episodes, steps=args.steps)
        t1 = time.perf_counter()
        stats = build_site(tmp / "site", [big])
        t2 = time.perf_counter()
        tiny = F.big_run(tmp / "tiny", episodes=1, steps=args.steps)
        build_site(tmp / "tiny-site", [tiny])
        total, kinds, nfiles = site_size(tmp / "site")
        print(f"run: {args.episodes} episodes x {args.steps} steps (fixture written in {t1 - t0:.1f} s)")
        print(f"site build (python -m eval.view): {t2 - t1:.1f} s; {nfiles} files, {total / 1e6:.1f} MB "
              f"(largest {stats.largest / 1e6:.2f} MB); by kind: "
              + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
        env = {**os.environ, "XDG_CONFIG_HOME": str(tmp / "xdg"), "XDG_CACHE_HOME": str(tmp / "xdg")}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, env=env)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            env0 = "crl/Sokoban-6x6-2-v0"
            measure(page, tmp / "tiny-site", "tiny", [(env0, 0)])  # warm-up: the browser's own first start
            base = measure(page, tmp / "tiny-site", "tiny", [(env0, 0)] * 3)
            picks = [(env0, s) for s in (0, args.episodes // 10, args.episodes // 5 - 1, 1, args.episodes // 7)]
            big_m = measure(page, tmp / "site", "big", picks)
            if args.docs:
                screenshots(browser, args.docs, tmp)
            browser.close()
    def line(name: str, key: str, target: float | None = None) -> None:
        ok = "" if target is None else ("  OK" if big_m[key] <= target else "  MISSED") + f" (target <= {target:.0f} ms)"
        print(f"{name:<34}{big_m[key]:9.0f} ms   baseline {base[key]:7.0f} ms   ratio {big_m[key] / max(base[key], 1):6.1f}x{ok}")
    line("open the run's episode list", "open", 2000)
    line("open an episode (median of 5)", "episode_median", 200)
    line("open an episode (slowest of 5)", "episode_max", 200)
    line("frame while scrolling 3 rows/frame", "wheel_median")
    line("slowest such frame", "wheel_max")
    line("scroll jump to a frame (median)", "scroll_frame_median")
    line("scroll jump to a frame (slowest)", "scroll_frame_max")
    line("first search (loads the index)", "search_first")
    line("another search", "search_again")
    print(f"rows in the DOM while scrolling: {big_m['rows']} (of {args.episodes} episodes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
