"""Build ``leaderboards/README.md`` (and, with ``--html DIR``, a browsable site) from every submission.

Usage: ``python -m leaderboards.build [--check] [--submissions DIR] [--out FILE] [--html DIR]``.
``--check`` validates without writing (CI runs it). A submission is a folder
``submissions/<date>_<agent>/`` holding a run's ``summary.json`` and a ``metadata.yaml``
with ``name, model, agent, date, url, verified``; where it also holds the run's ``episodes.jsonl`` and
``trajectories.jsonl.gz``, the site's run page for it lists and shows its episodes.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

from eval.fmt import pct
from leaderboards.schema import SubmissionError, load_submission

ROOT = Path(__file__).resolve().parent


def task_set_name(summary: dict) -> str:
    """The table a submission belongs in: its task set, also when the run named the set's ids one by one."""
    from eval.suites import TASK_SETS

    tasks = str(summary["run"].get("tasks", ""))
    if tasks in TASK_SETS:
        return f"task set {tasks}"
    for name, ids in TASK_SETS.items():
        if sorted(ids) == sorted(summary["tasks"]):
            return f"task set {name}"
    return "custom: " + ", ".join(sorted(summary["tasks"]))


NOTE = ("Success is the percentage of episodes solved, ± its standard error; "
        "episodes per task are shown per column. Progress is the mean normalised score in [0, 1] "
        "(for WebShop, the reward: its score is progress × 100). Step cap is the run's `--max-steps` "
        "(each env's own limit is used where it is lower); `env` means the envs' own limits.")


def _groups(subs: list[dict]) -> dict[str, list[dict]]:
    """Submissions per task set, best macro success first (a missing or NaN score last)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for s in subs:
        groups[task_set_name(s["summary"])].append(s)

    def score(s: dict) -> float:
        x = s["summary"]["macro"]["success"]
        return -x if x == x else float("inf")

    return {name: sorted(groups[name], key=score) for name in sorted(groups)}


def render(subs: list[dict]) -> str:
    lines = ["# crl-bench leaderboards", "",
             "Built by `python -m leaderboards.build` from `leaderboards/submissions/`. " + NOTE, ""]
    lines += render_experience_track([s for s in subs if "stream" in s["summary"]])
    for name, entries in _groups([s for s in subs if "stream" not in s["summary"]]).items():
        env_ids = sorted({e for s in entries for e in s["summary"]["tasks"]})
        lines += [f"## {name}", ""]
        header = ["rank", "name", "agent", "model", "step cap", "macro success %", "macro progress %"] + env_ids + ["verified", "date"]
        lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        for rank, s in enumerate(entries, 1):
            m, summ = s["metadata"], s["summary"]
            cap = summ["run"].get("max_steps")
            cells = [str(rank), f"[{m['name']}]({m['url']})" if m["url"] else m["name"], m["agent"], m["model"],
                     str(cap) if cap else "env",
                     f"{pct(summ['macro']['success'])} ± {pct(summ['macro']['success_se'])}",
                     pct(summ["macro"].get("progress", float("nan")))]
            for e in env_ids:
                t = summ["tasks"].get(e)
                cells.append(f"{pct(t['success'])} ± {pct(t['success_se'])} (n={t['episodes']})" if t else "–")
            cells += ["yes" if m["verified"] else "no", m["date"]]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


EXPERIENCE_NOTE = ("Runs of `eval.run --stream N` on held-out worlds (README: The experience track). Ranked by the "
                   "macro **experience gain**: success over the last half of each world's stream with memory minus "
                   "without, same seeds, ± standard error over worlds; per task `gain (with / without memory)`.")


def render_experience_track(entries: list[dict]) -> list[str]:
    """The experience track's table (stream runs), best macro experience gain first."""
    if not entries:
        return []

    def gain(s: dict) -> float:
        x = s["summary"]["stream"]["macro"]["experience_gain"]
        return -x if x == x else float("inf")

    entries = sorted(entries, key=gain)
    env_ids = sorted({e for s in entries for e in s["summary"]["stream"]["tasks"]})
    lines = ["## experience track", "", EXPERIENCE_NOTE, ""]
    header = ["rank", "name", "agent", "model", "worlds x stream", "macro gain"] + env_ids + ["verified", "date"]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for rank, s in enumerate(entries, 1):
        m, st = s["metadata"], s["summary"]["stream"]
        worlds = max((t["worlds"] for t in st["tasks"].values()), default=0)
        cells = [str(rank), f"[{m['name']}]({m['url']})" if m["url"] else m["name"], m["agent"], m["model"],
                 f"{worlds} x {st['stream']}",
                 f"{st['macro']['experience_gain'] * 100:+.1f} ± {st['macro']['experience_gain_se'] * 100:.1f}"]
        for e in env_ids:
            t = st["tasks"].get(e)
            cells.append(f"{t['experience_gain'] * 100:+.1f} ± {t['experience_gain_se'] * 100:.1f} "
                         f"({pct(t['tail_success_memory'])} / {pct(t['tail_success_no_memory'])})" if t else "–")
        cells += ["yes" if m["verified"] else "no", m["date"]]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


DISPLAY_CHARS = 36


def display_names(names: list[str], limit: int = DISPLAY_CHARS) -> list[str]:
    """Short names for the site's tables (the full name shows on hover).

    A name is cut at its first parenthesis, then at a word within ``limit`` characters. Names of one table
    that would read alike get the first part of their own (between commas or brackets) that tells them apart,
    e.g. ``llm agent, SmolLM2-135M + LoRA… (seed 1)``.
    """
    def cut(text: str, n: int) -> str:
        text = text.strip()
        if len(text) <= n:
            return text
        head = text[: n - 1]
        if " " in head[n // 2:]:
            head = head[: head.rindex(" ")]
        return head.rstrip(" ,;:(-") + "…"

    heads = [cut(re.split(r"\s\(", name, maxsplit=1)[0] or name, limit) for name in names]
    out = list(heads)
    for head in {h for h in heads if heads.count(h) > 1}:
        alike = [i for i, h in enumerate(heads) if h == head]
        parts = {i: [x.strip() for x in re.split(r"[(),;]", names[i]) if x.strip()] for i in alike}
        for i in alike:
            others = set().union(*(parts[j] for j in alike if j != i))
            tell = next((x for x in parts[i] if x not in others), None)
            if tell:
                out[i] = f"{head} ({cut(tell, 16)})"
    return out


def leaderboard_data(subs: list[dict], run_ids: dict[str, str]) -> dict:
    """The leaderboard as the site shows it: one group per task set, entries ranked as in the Markdown.

    ``run_ids`` maps a submission folder to its run's id in the site (the row links to that run page).
    """
    groups = []
    for name, entries in _groups([s for s in subs if "stream" not in s["summary"]]).items():
        rows = []
        short = display_names([s["metadata"]["name"] for s in entries])
        for rank, s in enumerate(entries, 1):
            m, summ = s["metadata"], s["summary"]
            cap = summ["run"].get("max_steps")
            rows.append({
                "rank": rank, "name": m["name"], "display": short[rank - 1], "agent": m["agent"], "model": m["model"], "url": m["url"],
                "verified": m["verified"], "date": m["date"], "step_cap": cap if isinstance(cap, int) else None,
                "success": summ["macro"]["success"], "success_se": summ["macro"]["success_se"],
                "progress": summ["macro"].get("progress"), "run": run_ids.get(str(s["folder"])),
                "tasks": {e: {"success": t["success"], "success_se": t["success_se"], "episodes": t["episodes"]}
                          for e, t in summ["tasks"].items()},
            })
        groups.append({"name": name, "tasks": sorted({e for r in rows for e in r["tasks"]}), "entries": rows})
    track = experience_track_data([s for s in subs if "stream" in s["summary"]], run_ids)
    return {"note": NOTE.replace("`", ""), "groups": groups + ([track] if track["entries"] else [])}


def experience_track_data(subs: list[dict], run_ids: dict[str, str]) -> dict:
    """The experience track as the site shows it: a group of ``kind`` "experience", ranked as in the Markdown
    (macro experience gain first), each task's gain with its tail success with and without memory."""
    def gain(s: dict) -> float:
        x = s["summary"]["stream"]["macro"]["experience_gain"]
        return -x if x == x else float("inf")

    entries = sorted(subs, key=gain)
    short = display_names([s["metadata"]["name"] for s in entries])
    rows = []
    for rank, s in enumerate(entries, 1):
        m, st = s["metadata"], s["summary"]["stream"]
        rows.append({
            "rank": rank, "name": m["name"], "display": short[rank - 1], "agent": m["agent"], "model": m["model"],
            "url": m["url"], "verified": m["verified"], "date": m["date"], "run": run_ids.get(str(s["folder"])),
            "stream": st["stream"], "worlds": max((t["worlds"] for t in st["tasks"].values()), default=0),
            "gain": st["macro"]["experience_gain"], "gain_se": st["macro"]["experience_gain_se"],
            "tasks": {e: {"gain": t["experience_gain"], "gain_se": t["experience_gain_se"],
                          "memory": t["tail_success_memory"], "no_memory": t["tail_success_no_memory"]}
                      for e, t in st["tasks"].items()},
        })
    return {"name": "experience track", "kind": "experience", "note": EXPERIENCE_NOTE.replace("`", "").replace("**", ""),
            "tasks": sorted({e for r in rows for e in r["tasks"]}), "entries": rows}


def write_html(subs: list[dict], out: Path) -> str:
    """Write the leaderboard site (with a run page per submission) to ``out``; returns a report (what could not
    be read of a submission's episodes, one warning a line, then what was written)."""
    from eval.view import load_runs
    from eval.view.data import jsonable
    from eval.view.site import write_site

    runs = load_runs([s["folder"] for s in subs], labels=[s["metadata"]["name"] for s in subs])
    ids = {str(s["folder"]): r.id for s, r in zip(subs, runs, strict=True)}
    stats = write_site(out, runs, leaderboard=jsonable(leaderboard_data(subs, ids)), title="crl-bench leaderboards")
    return "".join(f"warning: {w}\n" for w in stats.warnings) + (
        f"wrote {out / 'index.html'} ({stats.files} files, {stats.bytes / 1e6:.1f} MB)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m leaderboards.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--submissions", type=Path, default=ROOT / "submissions")
    p.add_argument("--out", type=Path, default=ROOT / "README.md")
    p.add_argument("--check", action="store_true", help="validate only")
    p.add_argument("--html", type=Path, metavar="DIR",
                   help="also write the leaderboard as a static site (opens from disk) into DIR")
    args = p.parse_args(argv)
    folders = sorted(d for d in args.submissions.iterdir() if d.is_dir()) if args.submissions.exists() else []
    subs, errors = [], []
    for d in folders:
        try:
            subs.append(load_submission(d))
        except SubmissionError as e:
            errors.append(str(e))
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    if errors:
        return 1
    if not args.check:
        args.out.write_text(render(subs), encoding="utf-8")
    print(f"{len(subs)} submissions valid" + ("" if args.check else f"; wrote {args.out}"))
    if args.html and not args.check:
        try:
            print(write_html(subs, args.html))
        except (FileExistsError, FileNotFoundError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
