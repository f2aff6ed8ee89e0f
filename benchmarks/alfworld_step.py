"""ALFWorld: generation, reset and step times of crl-bench's env vs plain ``textworld.gym`` on the same games.

    python benchmarks/alfworld_step.py [games_per_task_type] [repeats]

1. Generation: fresh games (one per task type by default) into a temporary cache; each is built,
   planned, replayed to a win in TextWorld and written.
2. On each generated game, three players run the same commands (``look``, ``inventory``, then the
   winning walkthrough), ``repeats`` times, interleaved:

   * ``plain``: ``textworld.gym`` with alfworld's ``AlfredDemangler`` and ``AlfredInfos``, as
     alfworld's ``AlfredTWEnv`` builds it (the baseline);
   * ``wrapper``: ``gym.make("crl/ALFWorld-v0")`` with the TextWorld memoisation switched off, so
     the ratio to plain is the wrapper's own overhead (admissibility check, plan tracking,
     progress from the facts, Gymnasium wrappers). Target: <= 1.10;
   * ``crl``: ``gym.make("crl/ALFWorld-v0")`` as users get it (translation and parses memoised).

Times are CPU seconds of this process (``time.process_time``), so other processes on a shared
machine do not inflate them; p50/p99 over all resets/steps; ratios are of p50s.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import warnings

import gymnasium as gym
import numpy as np

warnings.filterwarnings("ignore")

import crl_envs  # noqa: E402,F401
from crl_envs.alfworld import engine  # noqa: E402
from crl_envs.alfworld import games as games_mod  # noqa: E402
from crl_envs.alfworld.generator import TASK_TYPES  # noqa: E402


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) * 1000


def _timed(fn, *args):
    t = time.process_time()
    out = fn(*args)
    return out, time.process_time() - t


def generate(n_per_type: int, root: str) -> tuple[list[str], list[float]]:
    paths, times = [], []
    for task_type in TASK_TYPES:
        for seed in range(n_per_type):
            path, dt = _timed(lambda t=task_type, s=seed: games_mod.get_game(t, 10_000 + s, root=root))
            paths.append(path)
            times.append(dt)
    return paths, times


def run_plain(path: str, commands: list[str], resets: list, steps: list) -> None:
    env = engine.make_textworld_env(path)
    _, dt = _timed(env.reset)
    resets.append(dt)
    for c in commands:
        _, dt = _timed(env.step, c)
        steps.append(dt)
    engine.close_textworld_env(env)


def run_crl(env: gym.Env, path: str, commands: list[str], resets: list, steps: list, memo: bool) -> None:
    ctx = contextlib.nullcontext() if memo else _no_memo()
    with ctx:
        _, dt = _timed(lambda: env.reset(options={"game_file": path}))
        resets.append(dt)
        for c in commands:
            (_, _, term, _, info), dt = _timed(env.step, c)
            assert info["valid_action"], c
            steps.append(dt)
        assert term and info["success"]


@contextlib.contextmanager
def _no_memo():
    saved = engine.fast_path
    engine.fast_path = contextlib.nullcontext
    try:
        yield
    finally:
        engine.fast_path = saved


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with tempfile.TemporaryDirectory() as root:
        paths, gen = generate(n, root)
        print(f"generation: {len(paths)} games, p50 {_pct(gen, 50) / 1000:.2f} s, max {max(gen):.2f} s (CPU)")
        timings = {k: ([], []) for k in ("plain", "wrapper", "crl")}
        envs = {"wrapper": gym.make("crl/ALFWorld-v0", max_episode_steps=10**6),
                "crl": gym.make("crl/ALFWorld-v0", max_episode_steps=10**6)}
        for rep in range(repeats):
            for path in paths:
                commands = ["look", "inventory"] + games_mod.read_game(path)["walkthrough"]
                order = ["plain", "wrapper", "crl"] if rep % 2 == 0 else ["crl", "wrapper", "plain"]
                for kind in order:
                    resets, steps = timings[kind]
                    if kind == "plain":
                        run_plain(path, commands, resets, steps)
                    else:
                        run_crl(envs[kind], path, commands, resets, steps, memo=kind == "crl")
        for env in envs.values():
            env.close()
    print(f"{len(paths)} games x {repeats} repeats; CPU milliseconds")
    print(f"{'player':<9}{'reset p50':>11}{'reset p99':>11}{'step p50':>10}{'step p99':>10}"
          f"{'reset ratio':>13}{'step ratio':>12}")
    base_r, base_s = _pct(timings["plain"][0], 50), _pct(timings["plain"][1], 50)
    for kind, (resets, steps) in timings.items():
        r50, s50 = _pct(resets, 50), _pct(steps, 50)
        print(f"{kind:<9}{r50:>11.1f}{_pct(resets, 99):>11.1f}{s50:>10.1f}{_pct(steps, 99):>10.1f}"
              f"{r50 / base_r:>13.2f}{s50 / base_s:>12.2f}")
    print("ratios are player p50 / plain textworld.gym p50; wrapper overhead target: step ratio <= 1.10")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
