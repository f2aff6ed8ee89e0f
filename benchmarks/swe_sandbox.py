"""SWE sandbox speed: bwrap command latency against a plain subprocess, and grading time.

Baselines are measured in the same run, interleaved so machine load hits both alike:
- command latency: the same ``bash -c`` command as a plain subprocess (same rlimits, same
  bounded reader) and inside bwrap; target: bwrap adds < 50 ms per command;
- grading: one bundled instance graded with its gold patch (fresh checkout, patches applied in
  the sandbox, tests, swebench's parser and report), with the plain-subprocess ``pytest`` run of
  the same test file as its baseline; and one full oracle episode through the env.

Run: ``python benchmarks/swe_sandbox.py [--n 40]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import gymnasium as gym

import crl_envs  # noqa: F401
from crl_envs.swe.bundled import bundled_instances, bundled_repos_dir
from crl_envs.swe.grading import grade_patch
from crl_envs.swe.instances import checkout, find_repo_source
from crl_envs.swe.sandbox import Limits, LocalSandbox, make_sandbox, run_bounded, sandbox_env


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def bench_commands(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        limits = Limits()
        box = make_sandbox("bwrap", ws, limits)
        env = sandbox_env([], str(ws))
        for cmd in ("true", "ls -la && git --version"):
            plain, wrapped = [], []
            for _ in range(n):
                t = time.perf_counter()
                run_bounded(["bash", "-c", cmd], timeout_s=30, output_bytes=16384, env=env, cwd=str(ws), limits=limits)
                plain.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                box.run(cmd)
                wrapped.append((time.perf_counter() - t) * 1000)
            p50p, p50b = statistics.median(plain), statistics.median(wrapped)
            print(f"command {cmd!r:28} plain p50 {p50p:6.1f} ms p90 {_pct(plain, .9):6.1f} | bwrap p50 {p50b:6.1f} ms "
                  f"p90 {_pct(wrapped, .9):6.1f} | added p50 {p50b - p50p:+6.1f} ms (target < 50 ms), "
                  f"ratio {p50b / p50p:.2f}x")
        box.close()


def bench_grading(reps: int) -> None:
    inst = next(i for i in bundled_instances() if i.instance_id == "crl-mini__spanlib-11")
    src = find_repo_source(inst, bundled_repos_dir())
    base, graded = [], []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as tmp:
            repo = checkout(src, inst.base_commit, Path(tmp) / "repo")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                local = LocalSandbox(repo, Limits())
            t = time.perf_counter()
            local.run(inst.test_command())
            base.append(time.perf_counter() - t)
        t = time.perf_counter()
        g = grade_patch(inst, inst.patch, source=src)
        graded.append(time.perf_counter() - t)
        assert g.resolved
    print(f"grade one bundled instance ({inst.instance_id}): p50 {statistics.median(graded):.2f} s "
          f"(plain pytest run of its test file: {statistics.median(base):.2f} s; "
          f"ratio {statistics.median(graded) / statistics.median(base):.2f}x)")
    env = gym.make("crl/SWE-Mini-v0")
    episodes = []
    for _ in range(reps):
        t = time.perf_counter()
        env.reset(options={"instance_id": inst.instance_id})
        reward, done = 0.0, False
        while not done:
            _, reward, term, trunc, _ = env.step(env.unwrapped.oracle_action())
            done = term or trunc
        episodes.append(time.perf_counter() - t)
        assert reward == 1.0
    env.close()
    print(f"oracle episode (reset, one command applying the gold patch, submit + grading): p50 {statistics.median(episodes):.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40, help="commands per latency measurement")
    ap.add_argument("--reps", type=int, default=3, help="gradings / episodes")
    args = ap.parse_args()
    bundled_instances()  # build the bundled set outside the timings
    bench_commands(args.n)
    bench_grading(args.reps)


if __name__ == "__main__":
    main()
