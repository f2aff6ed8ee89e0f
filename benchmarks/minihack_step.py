"""Raw nle steps/s vs crl-bench MiniHack text-env steps/s (same actions, same obs keys).

    python benchmarks/minihack_step.py [n_steps]

The text env's rate includes the full rendering (map, legend, inventory), and the
``admissible_actions`` info key. Target: text env >= 0.5x of raw.
"""

from __future__ import annotations

import sys
import time

import gymnasium as gym
import numpy as np

import crl_envs  # noqa: F401
from crl_envs.minihack.env import _OBS_KEYS, MiniHackTextEnv

TASKS = ("Room-5x5", "MazeWalk-9x9", "KeyRoom-S5")


def bench(variant: str, n: int) -> tuple[float, float]:
    text = MiniHackTextEnv(task=f"MiniHack-{variant}-v0")
    names = list(text._named)
    raw = gym.make(f"MiniHack-{variant}-v0", observation_keys=_OBS_KEYS, actions=text._nle.unwrapped.actions,
                   max_episode_steps=10**7, disable_env_checker=True)
    acts = np.random.default_rng(0).integers(len(names), size=n)
    raw_index = {int(a): i for i, a in enumerate(raw.unwrapped.actions)}
    raw_acts = [raw_index[text._named[names[a]]] for a in acts]

    raw.reset()
    t = time.perf_counter()
    for a in raw_acts:
        *_, term, trunc, _ = raw.step(a)
        if term or trunc:
            raw.reset()
    raw_rate = n / (time.perf_counter() - t)

    text.reset(seed=0)
    t = time.perf_counter()
    for a in acts:
        *_, term, trunc, _ = text.step(names[a])
        if term or trunc:
            text.reset()
    text_rate = n / (time.perf_counter() - t)
    raw.close()
    text.close()
    return raw_rate, text_rate


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    print(f"{'task':<14}{'raw steps/s':>14}{'text steps/s':>14}{'ratio':>8}")
    for v in TASKS:
        raw_rate, text_rate = bench(v, n)
        print(f"{v:<14}{raw_rate:>14.0f}{text_rate:>14.0f}{text_rate / raw_rate:>8.2f}")


if __name__ == "__main__":
    main()
