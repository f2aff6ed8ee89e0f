"""Harness overhead per step: ``eval.run``'s episode loop against calling the env directly.

Both loops play the same seeded episodes with the same random policy on the same env, in
the same run:
- baseline: ``env.reset`` / ``env.step`` in a plain Python loop;
- harness: ``eval.run.run_episode`` (async policy call, result bookkeeping) in-process;
- pool: the same through a 1-worker :class:`~crl_envs.pool.EnvPool` (process boundary).

Run: ``python benchmarks/harness_overhead.py [--episodes N]``
"""

from __future__ import annotations

import argparse
import asyncio
import time

import gymnasium as gym
import numpy as np

import crl_envs  # noqa: F401
from crl_agent.agents.base import EpisodeContext
from crl_agent.agents.random import RandomAgent
from crl_envs.pool import EnvPool
from eval.run import LocalHandle, PoolHandle, run_episode

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
            action = asyncio_free_act(policy, info)
            obs, _, term, trunc, info = env.step(action)
            steps += 1
    return time.perf_counter() - t0, steps


def asyncio_free_act(policy, info) -> str:
    # The random policy's choice without the coroutine machinery (the baseline has none).
    choices = info["admissible_actions"]
    return str(choices[int(policy.rng.integers(len(choices)))])


async def harness(episodes: int, pooled: bool) -> tuple[float, int]:
    agent = RandomAgent(seed=0)
    pool = None
    if pooled:
        pool = EnvPool([ENV_ID], num_workers=1, timeout=30)
        await pool.start()
        handle = PoolHandle(pool, 0, has_solver=True)
    else:
        handle = LocalHandle(ENV_ID)
    steps = 0
    t0 = time.perf_counter()
    for seed in range(episodes):
        result = await run_episode(handle, agent, ENV_ID, seed, seed)
        assert result.error is None, result.error
        steps += result.actions
    elapsed = time.perf_counter() - t0
    handle.close()
    if pool is not None:
        pool.close()
    return elapsed, steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    rows = {"direct": [], "harness": [], "pool": []}
    counts = {}
    for _ in range(args.repeats):  # interleaved, so machine noise hits all three alike
        for name, fn in (("direct", lambda: direct(args.episodes)),
                         ("harness", lambda: asyncio.run(harness(args.episodes, False))),
                         ("pool", lambda: asyncio.run(harness(args.episodes, True)))):
            elapsed, steps = fn()
            rows[name].append(elapsed / steps * 1e6)
            counts[name] = steps
    assert len(set(counts.values())) == 1, f"the loops played different episodes: {counts}"
    base = float(np.median(rows["direct"]))
    print(f"{ENV_ID}, {args.episodes} episodes ({counts['direct']} steps), median of {args.repeats} interleaved runs")
    for name, xs in rows.items():
        med = float(np.median(xs))
        print(f"  {name:8s} {med:8.1f} us/step   {med / base:5.2f}x direct   overhead {med - base:+7.1f} us/step")


if __name__ == "__main__":
    main()
