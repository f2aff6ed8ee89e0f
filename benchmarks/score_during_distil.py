"""Latency of the actor's score requests while the extractor decodes a distillation, before and after interleaving.

The packaged SmolLM2-135M (transformers backend) serves both sides, as in ``eval.run --agent crl``: a
distillation of a real MiniHack trajectory (the extractor's distil prompt, ``--gen-tokens`` tokens,
end-of-turn ignored so every run decodes the same length) and, meanwhile, an actor that scores its
admissible actions at each observation of a real MiniHack episode, one request after the other
(each waits for the previous one, as a single episode's steps do). Measured twice in one run on the
same machine: ``interleave_steps=0`` (before: a score waits for the batch that is decoding) and the
backend's default (after: scores run between decoding steps). Reported: score latency (median, mean,
p90) during the distillation, scores answered during it, the distillation's own wall time (what
interleaving costs it), and the score latency with nothing else running.

Run: ``python benchmarks/score_during_distil.py`` (about 5 minutes on 2 cores); writes
``benchmarks/results/score_during_distil.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gymnasium as gym  # noqa: E402
from extractor_schema import play  # noqa: E402

import crl_envs  # noqa: E402, F401 - registers crl/* ids
from crl_agent.experience import extractor as ex  # noqa: E402
from crl_agent.llm import SamplingParams  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402

ENV = "crl/MiniHack-Room-Random-5x5-v0"
ACTOR_SYSTEM = "You play a text game. Reply with exactly one of the admissible actions."


def actor_prompts(n: int) -> list[tuple[list[dict], list[str]]]:
    """(chat, admissible actions) at each step of seeded MiniHack episodes (random admissible moves)."""
    import random

    out, seed = [], 0
    while len(out) < n:
        env = gym.make(ENV)
        rng = random.Random(seed)
        obs, info = env.reset(seed=seed)
        for _ in range(30):
            actions = info.get("admissible_actions") or ["north", "south", "east", "west"]
            out.append(([{"role": "system", "content": ACTOR_SYSTEM},
                         {"role": "user", "content": f"Goal: {info.get('task', '')}\n{obs}\nAction?"}], list(actions)))
            obs, _, terminated, truncated, info = env.step(rng.choice(actions))
            if terminated or truncated or len(out) >= n:
                break
        env.close()
        seed += 1
    return out


async def scores_while_distilling(llm: TransformersLLM, distil: list[dict], prompts, gen_tokens: int) -> dict:
    params = SamplingParams(max_tokens=gen_tokens, temperature=0.7, seed=0)
    llm.prefix_cache.clear()
    t0 = time.perf_counter()
    gen = asyncio.ensure_future(llm.chat(distil, params))
    await asyncio.sleep(0.5)  # the distillation is decoding
    latencies, k = [], 0
    while not gen.done():
        chat, actions = prompts[k % len(prompts)]
        k += 1
        s0 = time.perf_counter()
        await llm.score(chat, actions)
        latencies.append(time.perf_counter() - s0)
    completion = await gen
    return {"distil_seconds": time.perf_counter() - t0, "distil_tokens": completion.completion_tokens,
            "latencies": latencies}


async def idle_scores(llm: TransformersLLM, prompts, n: int) -> list[float]:
    out = []
    for chat, actions in prompts[:n]:
        s0 = time.perf_counter()
        await llm.score(chat, actions)
        out.append(time.perf_counter() - s0)
    return out


def stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"n": len(xs), "median_s": statistics.median(xs), "mean_s": statistics.fmean(xs),
            "p90_s": xs[min(len(xs) - 1, int(0.9 * len(xs)))], "max_s": xs[-1]}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gen-tokens", type=int, default=256, help="tokens each distillation decodes")
    ap.add_argument("--rounds", type=int, default=3, help="distillations per mode")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "score_during_distil.json"))
    args = ap.parse_args()
    distil = ex.distil_messages(play(ENV, 0, 15))
    prompts = actor_prompts(60)
    modes = {}
    for name, steps in (("before", 0), ("after", TransformersLLM.__init__.__kwdefaults__["interleave_steps"])):
        llm = TransformersLLM(None, num_threads=args.threads, interleave_steps=steps)
        llm.eos_ids = set()  # every distillation decodes gen_tokens tokens
        await idle_scores(llm, prompts, 2)  # warm-up
        idle = await idle_scores(llm, prompts, 10)
        rounds = [await scores_while_distilling(llm, distil, prompts, args.gen_tokens) for _ in range(args.rounds)]
        lat = [x for r in rounds for x in r["latencies"]]
        modes[name] = {
            "interleave_steps": steps,
            "score_latency_during_distillation": stats(lat),
            "scores_answered_per_distillation": statistics.fmean(len(r["latencies"]) for r in rounds),
            "distillation_seconds_mean": statistics.fmean(r["distil_seconds"] for r in rounds),
            "score_latency_idle": stats(idle),
            "rounds": rounds,
        }
        print(f"{name:6} (interleave_steps={steps}): score latency during a distillation median "
              f"{modes[name]['score_latency_during_distillation']['median_s']:.2f}s, mean "
              f"{modes[name]['score_latency_during_distillation']['mean_s']:.2f}s over {len(lat)} scores; "
              f"distillation {modes[name]['distillation_seconds_mean']:.1f}s; idle score "
              f"{modes[name]['score_latency_idle']['median_s']:.2f}s", flush=True)
        await llm.aclose()
    b, a = modes["before"], modes["after"]
    out = {
        "schema_version": 1, "benchmark": "score_during_distil", "model": "smollm2-135m", "threads": args.threads,
        "gen_tokens": args.gen_tokens, "rounds": args.rounds, "env": ENV,
        "median_latency_ratio_before_over_after": (b["score_latency_during_distillation"]["median_s"]
                                                   / a["score_latency_during_distillation"]["median_s"]),
        "mean_latency_ratio_before_over_after": (b["score_latency_during_distillation"]["mean_s"]
                                                 / a["score_latency_during_distillation"]["mean_s"]),
        "distillation_time_ratio_after_over_before": a["distillation_seconds_mean"] / b["distillation_seconds_mean"],
        "modes": modes,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"score latency during a distillation, before/after: median {out['median_latency_ratio_before_over_after']:.1f}x, "
          f"mean {out['mean_latency_ratio_before_over_after']:.1f}x; distillation time after/before "
          f"{out['distillation_time_ratio_after_over_before']:.2f}x -> {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
