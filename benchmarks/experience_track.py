"""Experience is necessary and sufficient on the experience track's tasks (issue 49).

For every track task it runs ``eval.run --stream`` with the scripted agents and reports, per task, the
success over the last half of each stream with memory and without (same seeds) and the experience gain:

- ``oracle-memory``: the family's solver with what it found in earlier episodes of the world
  (with memory) and with that memory wiped (without): the margin experience is worth;
- ``notebook``: the same solver fed only from a key-value notebook it writes from the observation text:
  how much of that margin a plain memory recovers;
- ``oracle`` (no memory at all) and ``random``: gain nothing.

Usage::

    python benchmarks/experience_track.py                       # 8 held-out worlds x streams of 6
    python benchmarks/experience_track.py --worlds 4 --stream 4 --agents notebook

Writes ``benchmarks/results/experience_track.json`` (and the run folders under ``--runs``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACK = ("crl/MiniHack-Corridors-3-v0", "crl/MiniHack-Corridors-5-v0", "crl/ALFWorld-House-v0")
AGENTS = ("oracle-memory", "notebook", "oracle", "random")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", default=",".join(AGENTS))
    p.add_argument("--tasks", default=",".join(TRACK))
    p.add_argument("--worlds", type=int, default=8)
    p.add_argument("--stream", type=int, default=6)
    p.add_argument("--first-world", type=int, default=1000, help="held-out worlds start at 1000")
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "experience_track")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "experience_track.json")
    args = p.parse_args(argv)
    from eval import run as eval_run

    rows: dict[str, dict] = {}
    for agent in args.agents.split(","):
        out = args.runs / agent
        t0 = time.perf_counter()
        argv_run = ["--agent", agent, "--tasks", args.tasks, "--stream", str(args.stream), "--episodes",
                    str(args.worlds), "--seed", str(args.first_world), "--out", str(out), "--quiet",
                    "--trajectories", "none"] + (["--resume"] if (out / "episodes.jsonl").exists() else [])
        if eval_run.main(argv_run) != 0:
            print(f"{agent}: eval.run failed", file=sys.stderr)
            return 1
        summary = json.loads((out / "summary.json").read_text())
        rows[agent] = {"wall_s": round(time.perf_counter() - t0, 1), "run": str(out.relative_to(ROOT))
                       if out.is_relative_to(ROOT) else str(out), "tasks": {}}
        for env_id, t in summary["stream"]["tasks"].items():
            rows[agent]["tasks"][env_id] = {k: t[k] for k in ("worlds", "curve_memory", "curve_no_memory",
                                                              "tail_success_memory", "tail_success_no_memory",
                                                              "experience_gain", "experience_gain_se")}
    verdict = {}
    for env_id in args.tasks.split(","):
        o = rows.get("oracle-memory", {}).get("tasks", {}).get(env_id)
        n = rows.get("notebook", {}).get("tasks", {}).get(env_id)
        r = rows.get("random", {}).get("tasks", {}).get(env_id)
        verdict[env_id] = {
            "oracle_margin": o and o["experience_gain"],
            "notebook_share_of_margin": (n["experience_gain"] / o["experience_gain"]
                                         if o and n and o["experience_gain"] else None),
            "random_gain": r and r["experience_gain"],
        }
    doc = {"benchmark": "experience_track", "worlds": args.worlds, "stream": args.stream,
           "first_world": args.first_world, "tail": max(1, args.stream // 2),
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "agents": rows, "verdict": verdict}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"{'task':32} {'agent':14} {'with':>6} {'without':>8} {'gain':>14}")
    for agent, row in rows.items():
        for env_id, t in row["tasks"].items():
            print(f"{env_id:32} {agent:14} {t['tail_success_memory']:6.1%} {t['tail_success_no_memory']:8.1%} "
                  f"{t['experience_gain'] * 100:+7.1f} ± {t['experience_gain_se'] * 100:4.1f}")
    for env_id, v in verdict.items():
        print(f"{env_id}: oracle margin {v['oracle_margin']}, notebook share {v['notebook_share_of_margin']}, "
              f"random gain {v['random_gain']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
