"""What experience costs the ``crl`` agent in wall-clock time: the same evaluation with it on and off.

Issue 28, item 2. Runs ``eval.run --agent crl --tasks 6 --episodes N --max-steps 30`` twice, one after the
other on an otherwise idle machine: ``--experience off`` (the actor alone) and ``--experience on`` (a fresh
bank: retrieval at each episode's start, the search tool, every finished episode distilled by the
extractor in the background, merges, and the run waits for queued distillations before it ends). Prints
the ratio on/off (target <= 1.5) and where the extra time went: the extractor calls (count, seconds,
tokens written, prompt tokens) from ``extractor_calls.jsonl``, and the actor's turns.

Run: ``python benchmarks/crl_overhead.py [--episodes 20] [--tasks 6] [--max-steps 30]``; results merge into
``benchmarks/results/crl_overhead.json`` by ``--tag`` (default: ``episodes<N>``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from host import cpu_model  # benchmarks/host.py: this script's folder is on sys.path

from crl_agent.experience.calllog import read_records
from eval.results import EpisodeLog

RESULTS = Path(__file__).parent / "results"


def run_eval(out: Path, experience: str, args: argparse.Namespace) -> dict:
    """One ``eval.run`` of the crl agent; returns its wall time and what it did."""
    cmd = [sys.executable, "-m", "eval.run", "--quiet", "--agent", "crl", "--tasks", args.tasks,
           "--episodes", str(args.episodes), "--max-steps", str(args.max_steps), "--seed", str(args.seed),
           "--out", str(out), "--experience", experience]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    rows = list(EpisodeLog(out / "episodes.jsonl").latest().values())
    ok = [r for r in rows if not r.get("error")]
    row = {"wall_s": round(wall, 1), "episodes": len(rows), "errored": len(rows) - len(ok),
           "success": sum(bool(r["success"]) for r in ok) / max(1, len(ok)),
           "actions": sum(r["actions"] for r in ok)}
    calls_path = out / "extractor_calls.jsonl"
    if calls_path.exists():
        calls = [c for c in read_records(calls_path) if c.get("type") == "call"]
        for kind in ("distil", "merge", "answer"):
            mine = [c for c in calls if c["kind"] == kind]
            if not mine:
                continue
            secs = [c.get("seconds", 0.0) for c in mine]
            row[kind] = {"calls": len(mine), "seconds_total": round(sum(secs), 1),
                         "seconds_median": round(statistics.median(secs), 1),
                         "tokens_written": sum(len(c.get("token_ids") or []) for c in mine),
                         "prompt_tokens_mean": round(statistics.mean(len(c.get("prompt_token_ids") or [])
                                                                     for c in mine)),
                         "with_errors": sum(bool(c.get("errors")) for c in mine)}
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="6", help="task set or ids (default: 6, the paper's six tasks)")
    p.add_argument("--episodes", type=int, default=20, help="episodes per task (default: 20)")
    p.add_argument("--max-steps", type=int, default=30, help="turn cap (default: 30, the paper's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tag", default=None, help="name of this measurement in the results (default: episodes<N>)")
    p.add_argument("--out", type=Path, default=Path("runs/crl_overhead"))
    args = p.parse_args()
    tag = args.tag or f"episodes{args.episodes}"
    row: dict = {"tasks": args.tasks, "episodes_per_task": args.episodes, "max_steps": args.max_steps}
    for experience in ("off", "on"):
        out = args.out / tag / experience
        if out.exists():
            raise SystemExit(f"{out} exists: remove it or pick another --out/--tag")
        row[experience] = run_eval(out, experience, args)
        r = row[experience]
        print(f"experience {experience}: {r['wall_s']:.0f} s, {r['episodes']} episodes ({r['errored']} errored), "
              f"{r['actions']} actions, success {r['success']:.1%}", flush=True)
        for kind in ("distil", "merge", "answer"):
            if kind in r:
                k = r[kind]
                print(f"  {kind}: {k['calls']} calls, {k['seconds_total']:.0f} s in the backend "
                      f"(median {k['seconds_median']:.1f} s), {k['tokens_written']} tokens written, "
                      f"{k['prompt_tokens_mean']} prompt tokens a call", flush=True)
    row["ratio_on_off"] = round(row["on"]["wall_s"] / row["off"]["wall_s"], 3)
    path = RESULTS / "crl_overhead.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update({"schema_version": "1.0", "target_ratio": 1.5})
    data.setdefault("runs", {})[tag] = {"machine": cpu_model(),
                                        "cpus": os.cpu_count(), **row}
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"experience on / off: {row['ratio_on_off']:.2f}x (target <= 1.5); wrote {path}")


if __name__ == "__main__":
    main()
