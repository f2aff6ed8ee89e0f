"""An upper bound for the experience channel: can correct, useful experience help the 135M actor at all?

Issue 28, item 4. A *gold* bank holds entries for MiniHack Room-Random written by rule from how the
env's solver finds its way (how to read the ``Objects:`` line, then which move closes the distance),
not by the extractor. The actor (the embedded SmolLM2-135M in score mode, as in
``benchmarks/train_cpu.py``'s held-out evaluation: temperature 1, history 2, seeds from 1,000,000,
never trained on) plays the same held-out seeds with experience off and with the gold bank shown
(retrieval as in ``--agent crl``, nothing distilled: ``learning=false``, no search-and-ask). With
``--adapter DIR`` it measures a trained actor (a LoRA adapter the trainer saved) the same way.

If gold experience does not raise success, nothing the extractor writes can, and Complementary RL's
actor side must learn to read experience (train with it shown) before the extractor's side can pay.

Run: ``python benchmarks/gold_experience.py [--episodes 32] [--concurrency 8] [--adapter DIR --label grpo]
[--device cuda]``;
results merge into ``benchmarks/results/gold_experience.json`` by label.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eval.results import EpisodeLog

RESULTS = Path(__file__).parent / "results"
TASK = "crl/MiniHack-Room-Random-5x5-Short-v0"
EVAL_SEED = 1_000_000  # crl_agent.train's first held-out seed

# What the env's solver does, in words: it reads the stairs' offset and closes both distances.
GOLD = [
    ("Reading the Objects line",
     "The Objects line gives where the staircase down (>) is from you. 'staircase down (>): 1 south, 2 east' "
     "means it is 1 row below you and 2 columns to your right. Only the directions it names bring you closer."),
    ("Which move to make",
     "Move toward the staircase: while the Objects line names both a north/south and an east/west distance, "
     "move diagonally (1 south, 2 east: southeast; 2 north, 1 west: northwest). When only one direction is "
     "left, move straight that way (0 south, 3 east: east). Standing on > ends the level with success."),
    ("Never move away",
     "A move in a direction the Objects line does not name takes you farther from the staircase. After each "
     "move, read the Objects line again: the distances shrink by one when the move was right."),
]


def gold_bank(path: Path) -> int:
    """Write the gold entries for :data:`TASK` into a bank folder; returns how many."""
    from crl_agent.experience import ExperienceBank

    bank = ExperienceBank(path, embedder="minilm")
    try:
        bank.add_many([(TASK, title, content, ["gold"], "gold") for title, content in GOLD])
        return len(bank.ids(TASK))
    finally:
        bank.close()


def evaluate(out: Path, episodes: int, concurrency: int, bank: Path | None, adapter: str | None,
             device: str = "cpu") -> dict:
    """One ``eval.run`` of the crl agent on the held-out seeds; experience off when ``bank`` is None."""
    cmd = [sys.executable, "-m", "eval.run", "--quiet", "--agent", "crl", "--tasks", TASK,
           "--episodes", str(episodes), "--seed", str(EVAL_SEED), "--concurrency", str(concurrency),
           "--out", str(out), "--trajectories", "text",
           "--agent-arg", "history=2", "--agent-arg", "temperature=1.0", "--agent-arg", "learning=false",
           "--agent-arg", "max_tool_calls=0", "--agent-arg", "action_mode=score", "--agent-arg", f"device={device}"]
    cmd += ["--experience", "off"] if bank is None else ["--bank", str(bank)]
    if adapter:
        cmd += ["--agent-arg", f"adapter={adapter}"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    rows = list(EpisodeLog(out / "episodes.jsonl").latest().values())
    ok = [r for r in rows if not r.get("error")]
    wins = sum(bool(r["success"]) for r in ok)
    n = len(ok)
    shown = [r.get("extra", {}).get("experience_shown", 0) for r in ok]
    rate = wins / n if n else float("nan")
    return {"episodes": len(rows), "errored": len(rows) - n, "success": rate,
            "stderr": math.sqrt(rate * (1 - rate) / n) if n else float("nan"),
            "mean_actions": sum(r["actions"] for r in ok) / max(1, n),
            "mean_entries_shown": sum(x if isinstance(x, (int, float)) else len(x) for x in shown) / max(1, n),
            "wall_s": time.perf_counter() - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=32, help="held-out seeds (default: 32)")
    p.add_argument("--concurrency", type=int, default=8, help="episodes in flight, scored in one batch (default: 8)")
    p.add_argument("--adapter", default=None, help="a trained actor's LoRA adapter folder (default: untrained)")
    p.add_argument("--label", default=None, help="name of this actor in the results (default: untrained/adapter)")
    p.add_argument("--device", default="cpu", help="where the actor runs: cpu (default) or cuda")
    p.add_argument("--out", type=Path, default=Path("runs/gold_experience"))
    args = p.parse_args()
    label = args.label or ("untrained" if args.adapter is None else Path(args.adapter).name)
    with tempfile.TemporaryDirectory(prefix="gold-bank-") as tmp:
        bank = Path(tmp) / "bank"
        n_entries = gold_bank(bank)
        row = {}
        for cond, b in (("off", None), ("gold", bank)):
            out = args.out / label / cond
            if out.exists():
                raise SystemExit(f"{out} exists: remove it or pick another --out/--label")
            row[cond] = evaluate(out, args.episodes, args.concurrency, b, args.adapter, args.device)
            print(f"{label} experience {cond}: success {row[cond]['success']:.1%} ± {row[cond]['stderr']:.1%} "
                  f"({row[cond]['episodes']} episodes, {row[cond]['errored']} errored, "
                  f"{row[cond]['mean_entries_shown']:.1f} entries shown, {row[cond]['wall_s']:.0f} s)", flush=True)
    row["gain_points"] = 100 * (row["gold"]["success"] - row["off"]["success"])
    path = RESULTS / "gold_experience.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update({"schema_version": "1.0", "task": TASK, "eval_seed": EVAL_SEED, "gold_entries": n_entries,
                 "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count()})
    data.setdefault("actors", {})[label] = {"adapter": args.adapter, "device": args.device, **row}
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"{label}: gold experience {row['gain_points']:+.1f} points; wrote {path}")


if __name__ == "__main__":
    main()
