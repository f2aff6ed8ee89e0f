"""Sokoban speed: env step, level generation and solver time.

Baselines are measured in the same run:
- step: the raw grid-update function (``SokobanEnv._move``, no text) on the same actions;
- generation/solve: absolute p50/p99 against the targets from the issue
  (peers on this machine: gem/TextArena step ~24 us; the official generator 2.9 ms p50 / 14 ms p99).

Run: ``python benchmarks/sokoban.py``
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

import crl_envs  # noqa: F401
from crl_envs.sokoban.env import SokobanEnv
from crl_envs.sokoban.generator import generate_level
from crl_envs.sokoban.solver import solve

MOVES = ["up", "down", "left", "right"]


def _pcts(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs)
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def bench_step(n: int = 20000) -> None:
    rng = np.random.default_rng(0)
    actions = [MOVES[i] for i in rng.integers(4, size=n)]

    def timed(step, reset) -> list[float]:
        reset()
        out = []
        for a in actions:
            t = time.perf_counter_ns()
            done = step(a)
            out.append((time.perf_counter_ns() - t) / 1000)
            if done:
                reset()
        return out

    env = SokobanEnv()
    raw = timed(lambda a: env._move(a) and False, lambda: env.reset(seed=0))
    text = timed(lambda a: env.step(a)[2], lambda: env.reset(seed=0))
    made = gym.make("crl/Sokoban-6x6-2-v0", disable_env_checker=True)
    wrapped = timed(lambda a: any(made.step(a)[2:4]), lambda: made.reset(seed=0))
    r50 = _pcts(raw)[0]
    for name, xs in [("raw grid update", raw), ("text env step", text), ("gym.make'd step (TimeLimit)", wrapped)]:
        p50, p99 = _pcts(xs)
        print(f"{name:30s} median {p50:7.2f} us  p99 {p99:7.2f} us  ratio to raw {p50 / r50:5.1f}x")
    print(f"target: text env step median <= 25 us (gem/TextArena ~24 us): {'OK' if _pcts(text)[0] <= 25 else 'MISSED'}")


def bench_generation(n: int = 300) -> None:
    gen, sol = [], []
    for seed in range(10_000, 10_000 + n):
        t = time.perf_counter()
        level = generate_level(6, 2, np.random.default_rng(seed))
        gen.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        solve(list(level.walls), level.targets, level.boxes, level.player, level.width)
        sol.append((time.perf_counter() - t) * 1000)
    g50, g99 = _pcts(gen)
    s50, s99 = _pcts(sol)
    print(f"generation 6x6/2 boxes (uncached, n={n}): p50 {g50:.2f} ms  p99 {g99:.2f} ms  "
          f"(targets 3 / 15 ms; official 2.9 / 14 ms: ratio {g50 / 2.9:.2f}x / {g99 / 14:.2f}x)")
    print(f"solver on the same levels: p50 {s50:.3f} ms  p99 {s99:.3f} ms")


def bench_success(n: int = 200) -> None:
    env = gym.make("crl/Sokoban-6x6-2-v0")
    rng = np.random.default_rng(0)
    for name, policy in [("oracle", lambda: env.unwrapped.oracle_action()), ("random", lambda: MOVES[rng.integers(4)])]:
        wins = 0
        for seed in range(n):
            env.reset(seed=seed)
            while True:
                _, _, term, trunc, info = env.step(policy())
                if term or trunc:
                    wins += info["success"]
                    break
        print(f"{name:6s} success on {n} seeded 6x6/2 levels: {wins / n:.1%}")


if __name__ == "__main__":
    bench_step()
    bench_generation()
    bench_success()
