"""The extractor's load in a crl step, replayed: a burst of distillations with search-and-ask answers arriving meanwhile.

In the benchmark's crl runs (``benchmarks/train_cpu.py --modes crl``) the extractor's engine serves two kinds
of generation at once: distillations of finished episodes (a ~1,300-token prompt, a constrained JSON reply
of up to ``--distil-max-tokens`` 128 tokens) and search-and-ask answers (a ~270-token prompt, up to 160
tokens, median 33), which the asking episode waits for. In the equal_steps crl seed 0 run an answer took
40 s at the median (p90 60 s) for 33 tokens: it queued behind distillations. This benchmark replays that
load on the packaged SmolLM2-135M (transformers backend) -- ``--distils`` distillations of real MiniHack
trajectories queued together for ``--distil-workers`` workers (the manager's: at most that many in flight),
and ``--answers`` questions, one every ``--answer-every`` seconds -- and
measures, per engine variant, in one run on one machine: the wall time until all are done, each kind's
latency (median, p90), and the generated tokens per second. Variants differ in the extractor engine's
settings only (``kv_room``: decode into key/value buffers with room instead of a copy per step;
``join_generations``: a request that arrives while a batch decodes joins it instead of waiting for it;
``max_batch_size``: most requests that decode together), so each variant's ratio to the first
(``baseline``: the settings before these changes) is what they buy.

Run: ``python benchmarks/extractor_load.py`` (about 10 minutes on 2 cores, alone on the machine); writes
``benchmarks/results/extractor_load/<host-slug>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from extractor_schema import SHOWN, play  # noqa: E402
from host import host_slug, machine_record  # noqa: E402

from crl_agent.experience import extractor as ex  # noqa: E402
from crl_agent.experience.manager import ManagerConfig  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402

SCHEMA_VERSION = "1.0"
ENV = "crl/MiniHack-Room-Random-5x5-Short-v0"
QUESTIONS = [
    "How do I find the stairs down?", "Which way should I move first?", "What should I do when a wall blocks me?",
    "Is the staircase usually near a corner?", "How do I avoid walking into walls?", "What ends the episode?",
]
# name -> the extractor engine's settings
VARIANTS = {
    "baseline": dict(kv_room=False, max_batch_size=8, join_generations=False),
    "kv_room": dict(kv_room=True, max_batch_size=8, join_generations=False),
    "kv_room+join": dict(kv_room=True, max_batch_size=8, join_generations=True),
    "kv_room+join+batch16": dict(kv_room=True, max_batch_size=16, join_generations=True),
    "kv_room+join+batch32": dict(kv_room=True, max_batch_size=32, join_generations=True),
}


def workload(distils: int, answers: int, distil_tokens: int, distil_chars: int):
    cfg = ManagerConfig()
    dparams = dataclasses.replace(cfg.distil_params, max_tokens=distil_tokens)
    jobs = []
    for i in range(distils):
        traj = play(ENV, i, 15)
        valid = {e.id for e in traj.retrieved}
        params = dataclasses.replace(dparams, seed=i, json_schema=ex.distil_schema(valid))
        jobs.append(("distil", ex.distil_messages(traj, distil_chars), params))
    entries = [dataclasses.replace(e, task=ENV) for e in SHOWN]
    for i in range(answers):
        params = dataclasses.replace(cfg.answer_params, seed=1000 + i)
        jobs.append(("answer", ex.answer_messages(ENV, QUESTIONS[i % len(QUESTIONS)], entries), params))
    return jobs


async def replay(llm: TransformersLLM, jobs, answer_every: float, workers: int) -> dict:
    llm.prefix_cache.clear()
    t0 = time.perf_counter()
    lat: dict[str, list[float]] = {"distil": [], "answer": []}
    tokens = 0

    distil_workers = asyncio.Semaphore(workers)  # the manager's distillation workers (--distil-workers)

    async def one(kind, messages, params, delay):
        nonlocal tokens
        await asyncio.sleep(delay)
        s = time.perf_counter()
        async with distil_workers if kind == "distil" else contextlib.nullcontext():
            c = await llm.chat(messages, params)
        lat[kind].append(time.perf_counter() - s)
        tokens += c.completion_tokens

    k = 0
    tasks = []
    for kind, messages, params in jobs:
        delay = 0.0 if kind == "distil" else answer_every * (1 + k)
        k += kind == "answer"
        tasks.append(one(kind, messages, params, delay))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    out = {"wall_s": round(wall, 2), "generated_tokens": tokens, "tokens_per_s": round(tokens / wall, 1)}
    for kind, xs in lat.items():
        xs = sorted(xs)
        out[kind] = {"n": len(xs), "median_s": round(statistics.median(xs), 2),
                     "p90_s": round(xs[min(len(xs) - 1, int(0.9 * len(xs)))], 2), "max_s": round(xs[-1], 2)}
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--distils", type=int, default=16, help="distillations submitted together")
    ap.add_argument("--answers", type=int, default=16, help="answers, arriving one every --answer-every s")
    ap.add_argument("--answer-every", type=float, default=1.5)
    ap.add_argument("--distil-tokens", type=int, default=128, help="the benchmark's --distil-max-tokens")
    ap.add_argument("--distil-chars", type=int, default=2000, help="the benchmark's --distil-chars")
    ap.add_argument("--distil-workers", type=int, default=8, help="the benchmark's --distil-workers: distillations "
                    "in flight at once (a distillation's latency counts its wait for a worker)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {sorted(VARIANTS)}")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    jobs = workload(args.distils, args.answers, args.distil_tokens, args.distil_chars)
    results = {}
    for name in args.variants.split(","):
        llm = TransformersLLM(None, num_threads=args.threads, seed=1, **VARIANTS[name])
        await llm.chat(jobs[-1][1], dataclasses.replace(jobs[-1][2], max_tokens=4))  # warm-up
        results[name] = {"settings": VARIANTS[name], **await replay(llm, jobs, args.answer_every, args.distil_workers)}
        await llm.aclose()
        r = results[name]
        print(f"{name:22} wall {r['wall_s']:7.1f}s  answers median {r['answer']['median_s']:5.1f}s "
              f"p90 {r['answer']['p90_s']:5.1f}s  distils median {r['distil']['median_s']:5.1f}s  "
              f"{r['tokens_per_s']:6.1f} tok/s", flush=True)
    base = results[next(iter(results))]
    for r in results.values():
        r["wall_ratio_to_first"] = round(r["wall_s"] / base["wall_s"], 3)
        r["answer_median_ratio_to_first"] = round(r["answer"]["median_s"] / base["answer"]["median_s"], 3)
    out = {"schema_version": SCHEMA_VERSION, "benchmark": "extractor_load", "env": ENV, "model": "smollm2-135m",
           "machine": machine_record(), "settings": vars(args), "variants": results}
    print("\n".join(f"{n:22} wall x{r['wall_ratio_to_first']:.2f}  answer median x{r['answer_median_ratio_to_first']:.2f}"
                    for n, r in results.items()))
    if not args.no_save:
        path = Path(__file__).parent / "results" / "extractor_load" / f"{host_slug()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(f"-> {path}")


if __name__ == "__main__":
    asyncio.run(main())
