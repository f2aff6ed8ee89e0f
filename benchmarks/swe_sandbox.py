"""SWE sandbox speed: bwrap and docker command latency against a plain subprocess, episode start and grading.

Baselines are measured in the same run, interleaved so machine load hits all alike:
- command latency: the same ``bash -c`` command as a plain subprocess (same rlimits, same
  bounded reader), inside bwrap, and with ``docker exec`` into the episode's running container;
  targets: bwrap adds < 50 ms per command, docker <= 100 ms (p50);
- episode start: ``env.reset`` (bwrap: checkout + sandbox; docker: a container from the instance
  image with its /testbed volume);
- grading: one bundled instance graded with its gold patch (fresh checkout or fresh container,
  patches applied in the sandbox, tests, swebench's parser and report), with the plain-subprocess
  ``pytest`` run of the same test file as its baseline; and one full oracle episode through the env.

docker runs only where an engine answers and the images are built
(``python -m crl_envs.swe.images build --bundled``); otherwise its rows say why they are missing.

Run: ``python benchmarks/swe_sandbox.py [--n 40] [--reps 3] [--sandboxes bwrap,docker]``
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
from crl_envs.swe.sandbox import Limits, LocalSandbox, Sandbox, run_bounded, sandbox_env
from crl_envs.swe.sandboxes import make_sandbox


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


TARGET_MS = {"bwrap": 50, "docker": 100}


def _docker_reason(inst) -> str:
    """Why docker cannot be measured here (empty when it can)."""
    from crl_envs.swe.docker_sandbox import docker_available
    from crl_envs.swe.images import ImageMissing, resolve_image

    reason = docker_available()
    if reason:
        return reason
    try:
        resolve_image(inst)
    except ImageMissing as e:
        return str(e)
    return ""


def _boxes(kinds: list[str], ws: Path, inst) -> dict[str, Sandbox]:
    boxes: dict[str, Sandbox] = {}
    for kind in kinds:
        if kind == "docker":
            from crl_envs.swe.docker_sandbox import DockerSandbox

            boxes[kind] = DockerSandbox(inst, Limits())  # the episode's container, commands exec into it
        else:
            boxes[kind] = make_sandbox(kind, ws, Limits())
    return boxes


def bench_commands(n: int, kinds: list[str], inst) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = checkout(find_repo_source(inst, bundled_repos_dir()), inst.base_commit, Path(tmp) / "ws")
        limits = Limits()
        boxes = _boxes(kinds, ws, inst)
        env = sandbox_env([], str(ws))
        try:
            for cmd in ("true", "ls -la && git --version"):
                plain: list[float] = []
                times: dict[str, list[float]] = {k: [] for k in boxes}
                for _ in range(n):
                    t = time.perf_counter()
                    run_bounded(["bash", "-c", cmd], timeout_s=30, output_bytes=16384, env=env, cwd=str(ws),
                                limits=limits)
                    plain.append((time.perf_counter() - t) * 1000)
                    for kind, box in boxes.items():
                        t = time.perf_counter()
                        res = box.run(cmd)
                        times[kind].append((time.perf_counter() - t) * 1000)
                        assert res.exit_code == 0, (kind, res.output)
                p50p = statistics.median(plain)
                row = f"command {cmd!r:28} plain p50 {p50p:6.1f} ms p90 {_pct(plain, .9):6.1f}"
                for kind, xs in times.items():
                    p50 = statistics.median(xs)
                    row += (f" | {kind} p50 {p50:6.1f} ms p90 {_pct(xs, .9):6.1f}, added p50 {p50 - p50p:+6.1f} ms "
                            f"(target <= {TARGET_MS[kind]} ms), ratio {p50 / p50p:.2f}x")
                print(row)
        finally:
            for box in boxes.values():
                box.close()


def bench_episode_start(reps: int, kinds: list[str], inst) -> None:
    for kind in kinds:
        env = gym.make("crl/SWE-Mini-v0", sandbox=kind)
        starts = []
        for _ in range(reps):
            t = time.perf_counter()
            env.reset(options={"instance_id": inst.instance_id})
            starts.append(time.perf_counter() - t)
        env.close()
        print(f"episode start ({kind}: env.reset, workspace and sandbox ready): p50 {statistics.median(starts):.2f} s, "
              f"max {max(starts):.2f} s")


def bench_grading(reps: int, kinds: list[str], inst) -> None:
    src = find_repo_source(inst, bundled_repos_dir())
    base: list[float] = []
    graded: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as tmp:
            repo = checkout(src, inst.base_commit, Path(tmp) / "repo")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                local = LocalSandbox(repo, Limits())
            t = time.perf_counter()
            local.run(inst.test_command())
            base.append(time.perf_counter() - t)
        for kind in kinds:
            t = time.perf_counter()
            g = grade_patch(inst, inst.patch, source=src, sandbox=kind)
            graded[kind].append(time.perf_counter() - t)
            assert g.resolved, (kind, g.log[-2000:])
    p50b = statistics.median(base)
    for kind, xs in graded.items():
        print(f"grade one bundled instance ({inst.instance_id}, {kind}): p50 {statistics.median(xs):.2f} s "
              f"(plain pytest run of its test file: {p50b:.2f} s; ratio {statistics.median(xs) / p50b:.2f}x)")
    for kind in kinds:
        env = gym.make("crl/SWE-Mini-v0", sandbox=kind)
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
        print(f"oracle episode ({kind}: reset, one command applying the gold patch, submit + grading): "
              f"p50 {statistics.median(episodes):.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40, help="commands per latency measurement")
    ap.add_argument("--reps", type=int, default=3, help="gradings / episodes")
    ap.add_argument("--sandboxes", default="bwrap,docker", help="comma-separated: bwrap, docker")
    args = ap.parse_args()
    inst = next(i for i in bundled_instances() if i.instance_id == "crl-mini__spanlib-11")  # built outside timings
    kinds = [k for k in args.sandboxes.split(",") if k]
    if "docker" in kinds:
        reason = _docker_reason(inst)
        if reason:
            print(f"docker: not measured ({reason})")
            kinds.remove("docker")
    bench_commands(args.n, kinds, inst)
    bench_episode_start(args.reps, kinds, inst)
    bench_grading(args.reps, kinds, inst)


if __name__ == "__main__":
    main()
