"""Build ``leaderboards/README.md`` from every submission, validating each.

Usage: ``python -m leaderboards.build [--check] [--submissions DIR] [--out FILE]``.
``--check`` validates without writing (CI runs it). A submission is a folder
``submissions/<date>_<agent>/`` holding a run's ``summary.json`` and a ``metadata.yaml``
with ``name, model, agent, date, url, verified``.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

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


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def render(subs: list[dict]) -> str:
    groups: dict[str, list[dict]] = defaultdict(list)
    for s in subs:
        groups[task_set_name(s["summary"])].append(s)
    lines = ["# crl-bench leaderboards", "",
             "Built by `python -m leaderboards.build` from `leaderboards/submissions/`. "
             "Success is the percentage of episodes solved, ± its standard error; "
             "episodes per task are shown per column. Progress is the mean normalised score in [0, 1] "
             "(for WebShop, the reward: its score is progress × 100). Step cap is the run's `--max-steps` "
             "(each env's own limit is used where it is lower); `env` means the envs' own limits.", ""]
    for name in sorted(groups):
        entries = sorted(groups[name], key=lambda s: -s["summary"]["macro"]["success"])
        env_ids = sorted({e for s in entries for e in s["summary"]["tasks"]})
        lines += [f"## {name}", ""]
        header = ["rank", "name", "agent", "model", "step cap", "macro success %", "macro progress %"] + env_ids + ["verified", "date"]
        lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        for rank, s in enumerate(entries, 1):
            m, summ = s["metadata"], s["summary"]
            cap = summ["run"].get("max_steps")
            cells = [str(rank), f"[{m['name']}]({m['url']})" if m["url"] else m["name"], m["agent"], m["model"],
                     str(cap) if cap else "env",
                     f"{_pct(summ['macro']['success'])} ± {_pct(summ['macro']['success_se'])}",
                     _pct(summ["macro"].get("progress", float("nan")))]
            for e in env_ids:
                t = summ["tasks"].get(e)
                cells.append(f"{_pct(t['success'])} ± {_pct(t['success_se'])} (n={t['episodes']})" if t else "–")
            cells += ["yes" if m["verified"] else "no", m["date"]]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m leaderboards.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--submissions", type=Path, default=ROOT / "submissions")
    p.add_argument("--out", type=Path, default=ROOT / "README.md")
    p.add_argument("--check", action="store_true", help="validate only")
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
