"""Prefill of a long distillation prompt: plain causal attention against the explicit 4D mask, in one run.

The transformers engine (:mod:`crl_agent.llm.hf_engine`) prefills generation rows that have nothing
cached and no padding with no explicit mask, so SDPA applies its own causal mask (``is_causal``);
every other forward builds a 4D additive mask. This times one generation request (one new token,
so the time is the prefill) on the packaged SmolLM2-135M in fp32, through engines on the same model:

- ``cold_masked``: the prompt alone, nothing cached, with the 4D mask (the engine before);
- ``cold_causal``: the same with no explicit mask (the engine now);
- ``warm_masked``: the prefix cache holds another trajectory's distil prompt, so the new prompt
  shares the system prompt with it (as every distillation after a backend's first does): the rest
  of the prompt with the 4D mask (both engines).

The prompt is the extractor's distil prompt over a played MiniHack episode (``--max-chars`` sets its
length). The machine's load average is recorded: other jobs on a 2-core machine move these times.

Run: ``python benchmarks/causal_prefill.py``; writes ``benchmarks/results/causal_prefill.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from extractor_schema import play  # noqa: E402

import crl_envs  # noqa: E402, F401 - registers crl/* ids
from crl_agent.experience import extractor as ex  # noqa: E402
from crl_agent.llm import SamplingParams  # noqa: E402
from crl_agent.llm.hf_engine import ForwardEngine, GenRequest  # noqa: E402
from crl_agent.llm.prefix_cache import PrefixCache  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402

ENV = "crl/MiniHack-Room-Random-5x5-v0"


def prefill_seconds(llm: TransformersLLM, prompt: list[int], *, causal: bool,
                    warm_with: list[int] | None) -> tuple[float, dict]:
    """Seconds for one forward over ``prompt`` (plus one sampled token), and which path it took."""
    engine = ForwardEngine(
        llm.model, device="cpu", pad_id=llm.pad_id, eos_ids=frozenset(), cache=PrefixCache(2**31 if warm_with else 0),
        decode_ids=llm.tokenizer.decode, model_name=llm.model_name, policy_version=lambda: 0, causal_prefill=causal,
    )
    params = SamplingParams(max_tokens=1, temperature=0)
    if warm_with is not None:
        engine.run([GenRequest(warm_with, params, 1, 0)])
        engine.prefills.causal = engine.prefills.masked = 0
    t = time.perf_counter()
    (out,) = engine.run([GenRequest(prompt, params, 1, 0)])
    seconds = time.perf_counter() - t
    if isinstance(out, Exception):
        raise out
    return seconds, {"causal": engine.prefills.causal, "masked": engine.prefills.masked,
                     "cached_tokens": engine.cache.stats.hit_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-chars", type=int, default=13000, help="trajectory characters in the distil prompt")
    ap.add_argument("--repeats", type=int, default=1, help="timings per mode (the median is reported)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "causal_prefill.json"))
    args = ap.parse_args()
    llm = TransformersLLM(None, dtype="float32", num_threads=args.threads)
    prompt = llm.render(ex.distil_messages(play(ENV, 0, 200), args.max_chars))
    other = llm.render(ex.distil_messages(play(ENV, 1, 200), args.max_chars))
    shared = next((k for k, (a, b) in enumerate(zip(prompt, other, strict=False)) if a != b), min(len(prompt), len(other)))
    load = os.getloadavg()[0]
    print(f"distil prompt: {len(prompt)} tokens ({shared} shared with another distillation's); load {load:.2f}",
          flush=True)
    prefill_seconds(llm, prompt[:256], causal=True, warm_with=None)  # warm-up
    modes = {}
    for name, causal, warm in (("cold_masked", False, None), ("cold_causal", True, None), ("warm_masked", True, other)):
        runs = [prefill_seconds(llm, prompt, causal=causal, warm_with=warm) for _ in range(args.repeats)]
        modes[name] = {"seconds": [s for s, _ in runs], "median_s": statistics.median(s for s, _ in runs),
                       "path": runs[-1][1]}
        print(f"  {name}: {modes[name]['median_s']:.2f} s (runs {', '.join(f'{s:.2f}' for s, _ in runs)}; "
              f"path {runs[-1][1]})", flush=True)
    ratio = modes["cold_masked"]["median_s"] / modes["cold_causal"]["median_s"]
    warm_ratio = modes["warm_masked"]["median_s"] / modes["cold_causal"]["median_s"]
    print(f"cold prefill, masked / causal: {ratio:.2f}x; warm (system prompt cached, masked) / cold causal: "
          f"{warm_ratio:.2f}x")
    out = {
        "schema_version": 1, "benchmark": "causal_prefill", "model": llm.model_name, "dtype": "float32",
        "threads": args.threads, "cpus": os.cpu_count(), "prompt_tokens": len(prompt), "shared_prefix_tokens": shared,
        "load_average_1min_at_start": load, "load_average_1min_at_end": os.getloadavg()[0],
        "masked_over_causal_cold": ratio, "warm_masked_over_cold_causal": warm_ratio, "modes": modes,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
