"""Raw nle steps/s vs crl-bench MiniHack text-env steps/s (same actions, same obs keys).

    python benchmarks/minihack_step.py [n_steps] [repeats]

Both envs come from ``gym.make`` (the raw one with our observation keys and action set,
the text one by its ``crl/`` id), so each rate includes the wrappers a user gets. The text
env's rate includes the full observation (map, status lines, position, the Objects part,
legend, inventory, actions) and the ``info`` keys. Raw and text runs alternate, ``repeats`` times per task,
and the printed ratio is the median of the per-repeat ratios, so load from other processes
hits both sides alike. Rates are steps per second of this process's CPU time
(``time.process_time``), which waiting behind other processes on a shared machine does not
inflate; the wall-clock ratio is printed too. Target: text env >= 0.5x of raw (aim: 0.8x).
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings

import gymnasium as gym
import numpy as np

warnings.filterwarnings("ignore", message=".*pkg_resources.*")

import crl_envs  # noqa: E402,F401
from crl_envs.minihack.env import _OBS_KEYS  # noqa: E402

TASKS = ("Room-5x5", "MazeWalk-9x9", "KeyRoom-S5")


def _run(env: gym.Env, actions: list) -> tuple[float, float]:
    """CPU-time and wall-clock steps per second over ``actions``, resetting when an episode ends."""
    env.reset(seed=0)
    wall, cpu = time.perf_counter(), time.process_time()
    for a in actions:
        *_, term, trunc, _ = env.step(a)
        if term or trunc:
            env.reset()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return len(actions) / cpu, len(actions) / wall


def bench(variant: str, n: int, repeats: int) -> tuple[float, float, float, float]:
    """Medians of the raw rate, the text rate, the per-repeat CPU ratio and wall ratio (one task)."""
    text = gym.make(f"crl/MiniHack-{variant}-v0", max_episode_steps=10**7)
    inner = text.unwrapped
    names = list(inner._named)
    raw = gym.make(f"MiniHack-{variant}-v0", observation_keys=_OBS_KEYS, actions=inner._nle.unwrapped.actions,
                   max_episode_steps=10**7, disable_env_checker=True)
    raw_index = {int(a): i for i, a in enumerate(raw.unwrapped.actions)}
    raws, texts, ratios, wall_ratios = [], [], [], []
    for rep in range(repeats):
        picks = np.random.default_rng(rep).integers(len(names), size=n)
        text_acts = [names[i] for i in picks]
        raw_acts = [raw_index[inner._named[a]] for a in text_acts]
        order = [("raw", raw, raw_acts), ("text", text, text_acts)]
        rates = {kind: _run(env, acts) for kind, env, acts in (order if rep % 2 == 0 else order[::-1])}
        raws.append(rates["raw"][0])
        texts.append(rates["text"][0])
        ratios.append(rates["text"][0] / rates["raw"][0])
        wall_ratios.append(rates["text"][1] / rates["raw"][1])
    raw.close()
    text.close()
    med = statistics.median
    return med(raws), med(texts), med(ratios), med(wall_ratios)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 11
    print(f"{n} random named actions per run, {repeats} interleaved repeats; medians; steps per CPU second")
    print(f"{'task':<14}{'raw steps/s':>14}{'text steps/s':>14}{'ratio':>8}{'wall ratio':>12}")
    for v in TASKS:
        raw_rate, text_rate, ratio, wall_ratio = bench(v, n, repeats)
        print(f"{v:<14}{raw_rate:>14.0f}{text_rate:>14.0f}{ratio:>8.2f}{wall_ratio:>12.2f}")


if __name__ == "__main__":
    main()
