"""Data-parallel training throughput: one trainer process against ``torchrun`` with N processes.

Runs ``python -m crl_agent.train`` for ``--steps`` steps twice on the same settings, as one process
(``--threads`` = all the cores on CPU, or one GPU) and under ``torchrun --nproc-per-node N`` (each rank one
share of the cores, or one GPU each), and reports from their ``metrics.jsonl`` the median step time, its
split into rollout and update, and rollout tokens/s, with the speed-up of the torchrun run over the
single process measured in the same session. Both runs play the same seeds and take the same update (the
gradient average over ranks equals one process's gradient on all the episodes), so only the speed differs.
Writes ``benchmarks/results/train_dp_<device>.json``.

Run: ``python benchmarks/train_dp.py [--nproc 2] [--device cpu|cuda] [--steps 4] [--groups 4] [--mode grpo]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(nproc: int, threads: int, args: argparse.Namespace, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    train = ["--out", str(out), "--quiet", "--mode", args.mode, "--tasks", args.tasks, "--device", args.device,
             "--steps", str(args.steps), "--groups", str(args.groups), "--group-size", str(args.group_size),
             "--eval-every", "0", "--eval-episodes", str(args.eval_episodes), "--threads", str(threads),
             "--history", "2", "--turns-per-episode", "2", "--lr", "5e-4", "--distil-max-tokens", "128",
             "--distil-per-group", "2", "--agent-arg", "max_tool_calls=0"]
    if args.model:
        train += ["--model", args.model]
    if nproc == 1:
        cmd = [sys.executable, "-m", "crl_agent.train", *train]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "crl_agent.train", *train]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"processes": nproc, "returncode": proc.returncode, "stderr": proc.stderr[-2000:]}
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steady = rows[1:] or rows  # the first step pays for warm-up
    return {
        "processes": nproc, "threads_per_process": threads, "returncode": 0, "wall_s": wall, "steps": len(rows),
        "step_s": statistics.median(r["time_s"] for r in steady),
        "rollout_s": statistics.median(r["rollout_s"] for r in steady),
        "update_s": statistics.median(r["update_s"] for r in steady),
        "rollout_tokens_per_s": statistics.median(r["rollout_tokens_per_s"] for r in steady),
        "episodes_per_step": rows[0]["episodes"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per process)")
    p.add_argument("--mode", default="grpo", choices=["grpo", "crl"])
    p.add_argument("--tasks", default="crl/MiniHack-Room-Random-5x5-Short-v0", help="as the trainer's --tasks")
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--eval-episodes", type=int, default=8)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "train_dp")
    args = p.parse_args()
    if args.device == "cuda":
        import torch

        if torch.cuda.device_count() < args.nproc:
            print(f"needs {args.nproc} CUDA GPUs, this machine has {torch.cuda.device_count()}: nothing measured")
            return 0
        single_threads = dist_threads = 1
    else:
        cores = os.cpu_count() or 1
        single_threads, dist_threads = cores, max(1, cores // args.nproc)
    runs = [run(1, single_threads, args, args.work / "single"),
            run(args.nproc, dist_threads, args, args.work / f"torchrun{args.nproc}")]
    out = {"schema_version": "1.0", "device": args.device, "cpu_count": os.cpu_count(), "settings": vars(args) | {
        "work": str(args.work)}, "runs": runs}
    if all(r["returncode"] == 0 for r in runs):
        out["speedup_step"] = runs[0]["step_s"] / runs[1]["step_s"]
        out["speedup_rollout_tokens_per_s"] = runs[1]["rollout_tokens_per_s"] / runs[0]["rollout_tokens_per_s"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"train_dp_{args.device}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'processes':>9s} {'threads':>7s} {'step s':>7s} {'rollout s':>9s} {'update s':>8s} {'rollout tok/s':>13s}")
    for r in runs:
        if r["returncode"]:
            print(f"{r['processes']:9d} failed (exit {r['returncode']}): {r['stderr'][-500:]}")
            continue
        print(f"{r['processes']:9d} {r['threads_per_process']:7d} {r['step_s']:7.1f} {r['rollout_s']:9.1f} "
              f"{r['update_s']:8.1f} {r['rollout_tokens_per_s']:13.0f}")
    if "speedup_step" in out:
        print(f"torchrun x{args.nproc} vs one process: step time {out['speedup_step']:.2f}x faster, rollout tokens/s "
              f"{out['speedup_rollout_tokens_per_s']:.2f}x")
    print(f"wrote {path}")
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
