"""GPU training throughput: vLLM rollouts and a LoRA learner on one GPU (``python -m crl_agent.train --backend vllm``).

Runs the trainer for ``--steps`` steps on a GPU and reports, from its ``metrics.jsonl``, rollout tokens/s
(prompt and candidate tokens the actor processed, per second of rollout), step time and its split into
rollout and update, beside the same run on the transformers backend (learner and generation sharing the
weights on the GPU) as the baseline measured in the same session. Writes
``benchmarks/results/train_gpu.json``. Without a CUDA GPU and vLLM it says so and exits 0.

Run: ``python benchmarks/train_gpu.py [--model DIR] [--steps 5] [--groups 16] [--group-size 8]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def run(backend: str, args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, "-m", "crl_agent.train", "--out", str(out), "--quiet", "--mode", args.mode,
           "--tasks", args.tasks, "--backend", backend, "--device", "cuda", "--steps", str(args.steps),
           "--groups", str(args.groups), "--group-size", str(args.group_size), "--eval-every", "0",
           "--eval-episodes", str(args.eval_episodes), "--lora-rank", "16"]
    if args.model:
        cmd += ["--model", args.model]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"backend": backend, "returncode": proc.returncode, "stderr": proc.stderr[-2000:]}
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steady = rows[1:] or rows  # the first step pays for compilation and warm-up
    return {
        "backend": backend, "returncode": 0, "wall_s": wall, "steps": len(rows),
        "rollout_tokens_per_s": statistics.median(r["rollout_tokens_per_s"] for r in steady),
        "step_s": statistics.median(r["time_s"] for r in steady),
        "rollout_s": statistics.median(r["rollout_s"] for r in steady),
        "update_s": statistics.median(r["update_s"] for r in steady),
        "train_success": [r["train_success"] for r in rows],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a local causal LM (default: the embedded SmolLM2-135M)")
    p.add_argument("--tasks", default="crl/MiniHack-Room-Random-5x5-Short-v0", help="as the trainer's --tasks")
    p.add_argument("--mode", default="grpo", choices=("grpo", "crl"))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--eval-episodes", type=int, default=32)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "train_gpu")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from crl_agent.llm.vllm_backend import vllm_available

    ok, why = vllm_available()
    if not ok:
        print(f"skipped: the GPU path needs vLLM and a CUDA GPU ({why})")
        return 0
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rows = [run(b, args, args.work / f"{stamp}-{b}") for b in ("transformers", "vllm")]
    base, fast = rows
    if base.get("returncode") == 0 and fast.get("returncode") == 0:
        fast["rollout_speedup_vs_transformers"] = fast["rollout_tokens_per_s"] / base["rollout_tokens_per_s"]
        fast["step_speedup_vs_transformers"] = base["step_s"] / fast["step_s"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"schema_version": "1.0", "settings": vars(args) | {"work": str(args.work)}, "runs": rows}
    (RESULTS / "train_gpu.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'backend':13s} {'rollout tok/s':>13s} {'step s':>7s} {'rollout s':>9s} {'update s':>8s}")
    for r in rows:
        if r.get("returncode") != 0:
            print(f"{r['backend']:13s} failed (exit {r.get('returncode')}): {r.get('stderr', '')[-300:]}")
            continue
        print(f"{r['backend']:13s} {r['rollout_tokens_per_s']:13.0f} {r['step_s']:7.1f} {r['rollout_s']:9.1f} "
              f"{r['update_s']:8.1f}")
    print(f"wrote {RESULTS / 'train_gpu.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
