"""Harness overhead per step, and what writing trajectories costs a whole run.

Part 1 plays the same seeded Sokoban episodes with the same random policy, in the same run:

- ``direct``: ``env.reset`` / ``env.step`` in a plain Python loop (the baseline);
- ``rollout``: :func:`crl_agent.rollout.run_episode` on the env in this process (async policy
  call, the per-step record, JSON-safe info), then its ``episodes.jsonl`` record (``none``);
- ``rollout+text``: the same plus the text trajectory record, encoded and gzipped as the
  recorder's writer thread does (here on the same thread, so its cost is counted);
- ``inline pool``: through ``make_pool(..., "inline")`` (a thread per slot, what ``eval.run`` uses);
- ``process pool``: through a 1-worker process pool (a process boundary per step).

Part 2 runs ``eval.run`` itself on N episodes with ``--trajectories none`` and ``text`` (interleaved)
and prints the ratio of their wall times (target ≤ 1.15: writing never stalls the loop).

Run: ``python benchmarks/harness_overhead.py [--episodes 60] [--run-episodes 2000]``
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import crl_envs  # noqa: F401
from crl_agent.agents.base import EpisodeContext
from crl_agent.agents.random import RandomAgent
from crl_agent.rollout import CallableSlot, PoolSlot, run_episode
from crl_envs.pool import make_pool
from eval.results import episode_record
from eval.trajectories import encode_member, make_record

ENV_ID = "crl/Sokoban-6x6-2-v0"


def direct(episodes: int) -> tuple[float, int]:
    env = gym.make(ENV_ID)
    agent = RandomAgent(seed=0)
    steps = 0
    t0 = time.perf_counter()
    for seed in range(episodes):
        policy = agent.make_policy(EpisodeContext(ENV_ID, seed))
        obs, info = env.reset(seed=seed)
        term = trunc = False
        while not (term or trunc):
            choices = info["admissible_actions"]  # the random policy's choice, without the coroutine
            obs, _, term, trunc, info = env.step(str(choices[int(policy.rng.integers(len(choices)))]))
            steps += 1
    return time.perf_counter() - t0, steps


async def harness(episodes: int, where: str, text: bool = False) -> tuple[float, int]:
    agent = RandomAgent(seed=0)
    pool = None
    if where == "local":
        slot = CallableSlot(gym.make(ENV_ID))
    else:
        pool = make_pool([ENV_ID], where, num_workers=1, timeout=30)
        await pool.start()
        slot = PoolSlot(pool, 0)
    steps = 0
    t0 = time.perf_counter()
    for seed in range(episodes):
        ep = await run_episode(slot, agent, EpisodeContext(ENV_ID, seed))
        assert ep.error is None, ep.error
        record, _ = episode_record(ep)
        if text:
            encode_member(make_record(ep.to_dict(), record, "text"))
        steps += ep.actions
    elapsed = time.perf_counter() - t0
    if pool is not None:
        pool.close()
    return elapsed, steps


def whole_run(episodes: int, mode: str) -> float:
    from eval.run import main

    out = Path(tempfile.mkdtemp(prefix=f"bench-{mode}-"))
    try:
        t0 = time.perf_counter()
        main(["--quiet", "--agent", "random", "--tasks", ENV_ID, "--episodes", str(episodes), "--out",
              str(out / "run"), "--trajectories", mode])
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--run-episodes", type=int, default=2000, help="episodes of each whole eval.run (0: skip part 2)")
    args = p.parse_args()
    loops = {
        "direct": lambda: direct(args.episodes),
        "rollout": lambda: asyncio.run(harness(args.episodes, "local")),
        "rollout+text": lambda: asyncio.run(harness(args.episodes, "local", text=True)),
        "inline pool": lambda: asyncio.run(harness(args.episodes, "inline")),
        "process pool": lambda: asyncio.run(harness(args.episodes, "process")),
    }
    rows: dict[str, list[float]] = {k: [] for k in loops}
    counts = {}
    for _ in range(args.repeats):  # interleaved, so machine noise hits every loop alike
        for name, fn in loops.items():
            elapsed, steps = fn()
            rows[name].append(elapsed / steps * 1e6)
            counts[name] = steps
    assert len(set(counts.values())) == 1, f"the loops played different episodes: {counts}"
    base = float(np.median(rows["direct"]))
    print(f"{ENV_ID}, {args.episodes} episodes ({counts['direct']} steps), median of {args.repeats} interleaved runs")
    for name, xs in rows.items():
        med = float(np.median(xs))
        print(f"  {name:13s} {med:8.1f} us/step   {med / base:5.2f}x direct   overhead {med - base:+7.1f} us/step")
    if args.run_episodes:
        times: dict[str, list[float]] = {"none": [], "text": []}
        for _ in range(2):
            for mode in times:
                times[mode].append(whole_run(args.run_episodes, mode))
        none, text = min(times["none"]), min(times["text"])
        print(f"eval.run, {args.run_episodes} episodes (best of 2): --trajectories none {none:.2f} s, "
              f"text {text:.2f} s, ratio {text / none:.3f} (target <= 1.15)")


if __name__ == "__main__":
    main()
