"""Env pool throughput against the plain sequential loop, on the same actions in the same run.

- cheap env (Sokoban 6x6): per-step overhead of each backend, in microseconds: the inline
  pool (a thread per slot; and ``threads=False``, on the loop) and the process pool
  (target <= 100 us on an idle machine; a peer's thread-based async vector env adds 26-96 us here);
- the Ray pool with 4, 16 and 64 slots on one actor (goal <= 200 us a step): its calls over the direct
  socket to the actor (the default), beside each actor's calls of one event-loop turn as one Ray call
  (``direct=False``, how the pool sent them before the socket) and one Ray call a step on the same actor
  (before that);
- CPU-heavy env (Sokoban that re-solves its level every step): speed-up with 2 workers on
  2 cores (target >= 1.7x).

Run: ``python benchmarks/pool.py``; writes ``benchmarks/results/pool.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import crl_envs  # noqa: E402,F401
from crl_envs.pool import make_pool  # noqa: E402

RESULTS = Path(__file__).parent / "results"
MOVES = ["up", "down", "left", "right"]
if "bench/HeavySokoban-v0" not in gym.registry:
    gym.register("bench/HeavySokoban-v0", entry_point="_heavy_env:HeavySokoban", max_episode_steps=100)


def _actions(n: int, seed: int) -> list[str]:
    return [MOVES[i] for i in np.random.default_rng(seed).integers(4, size=n)]


def sequential(env_id: str, n_envs: int, steps: int) -> float:
    envs = [gym.make(env_id) for _ in range(n_envs)]
    plans = [_actions(steps, i) for i in range(n_envs)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    t = time.perf_counter()
    for k in range(steps):
        for i, e in enumerate(envs):
            if any(e.step(plans[i][k])[2:4]):
                e.reset(seed=i)
    return time.perf_counter() - t


def pooled(env_id: str, n_envs: int, steps: int, workers: int | None, backend: str = "process",
           unbatched: bool = False, **options) -> float:
    """Seconds for ``n_envs`` episodes loops of ``steps`` steps through a pool; ``unbatched``: one Ray call a
    step straight to the actor (the Ray pool's calls before it batched them)."""
    plans = [_actions(steps, i) for i in range(n_envs)]

    async def main() -> float:
        async with make_pool([env_id] * n_envs, backend, num_workers=workers, **options) as pool:
            await asyncio.gather(*(pool.reset(i, seed=i) for i in range(n_envs)))

            async def step(i: int, a: str):
                if unbatched:
                    return await pool.actors[pool.slots[i].host].call.remote(i, "step", (a,), None)
                return await pool.step(i, a)

            async def run(i: int) -> None:
                for a in plans[i]:
                    if any((await step(i, a))[2:4]):
                        await pool.reset(i, seed=i)

            t = time.perf_counter()
            await asyncio.gather(*(run(i) for i in range(n_envs)))
            return time.perf_counter() - t

    return asyncio.run(main())


def _burn(n: int = 3_000_000) -> float:
    t = time.perf_counter()
    s = 0
    for i in range(n):
        s += i
    return time.perf_counter() - t


def cpu_scaling_ceiling() -> float:
    """How much faster two busy processes finish two jobs than one process does: the ceiling for 2 workers."""
    import multiprocessing as mp

    t = time.perf_counter()
    _burn()
    _burn()
    one = time.perf_counter() - t
    with mp.get_context("spawn").Pool(2) as p:
        p.map(_burn, [1000, 1000])  # warm the workers
        t = time.perf_counter()
        p.map(_burn, [3_000_000, 3_000_000])
        two = time.perf_counter() - t
    return one / two


def main() -> None:
    out: dict = {"schema_version": "1.0", "machine": platform.processor() or platform.machine(),
                 "cpus": os.cpu_count(), "cheap_env": "crl/Sokoban-6x6-2-v0",
                 "load_average_1min_at_start": os.getloadavg()[0]}
    n_envs, steps = 4, 2000
    seq = sequential("crl/Sokoban-6x6-2-v0", n_envs, steps)
    total = n_envs * steps
    out["sequential_us_per_step"] = seq / total * 1e6
    print(f"cheap env, {total} steps: sequential {seq / total * 1e6:.1f} us/step")
    for name, options in (("inline, a thread per slot", {}), ("inline, threads=False", {"threads": False})):
        t = pooled("crl/Sokoban-6x6-2-v0", n_envs, steps, None, "inline", **options)
        out[f"overhead_us_{name}"] = (t - seq) / total * 1e6
        print(f"  {name}: {t / total * 1e6:.1f} us/step, overhead {(t - seq) / total * 1e6:+.1f} us/step, "
              f"speed ratio {seq / t:.2f}x")
    for w in (1, 2):
        t = pooled("crl/Sokoban-6x6-2-v0", n_envs, steps, w)
        out[f"overhead_us_process_{w}_workers"] = (t - seq) / total * 1e6
        print(f"  pool {w} worker(s): {t / total * 1e6:.1f} us/step, overhead {(t - seq) / total * 1e6:+.1f} us/step "
              f"(target <= 100), speed ratio {seq / t:.2f}x")
    try:
        import ray

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        # a cluster of its own, even where another one runs on this machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}})
        per_step = seq / total
        for n, ray_steps in ((4, 500), (16, 200), (64, 60)):
            t1 = pooled("crl/Sokoban-6x6-2-v0", n, ray_steps, 1, backend="ray", unbatched=True)
            t2 = pooled("crl/Sokoban-6x6-2-v0", n, ray_steps, 1, backend="ray", direct=False)
            t = pooled("crl/Sokoban-6x6-2-v0", n, ray_steps, 1, backend="ray")
            over1, over2, over = ((x / (n * ray_steps) - per_step) * 1e6 for x in (t1, t2, t))
            out[f"overhead_us_ray_{n}_slots"] = over
            out[f"overhead_us_ray_{n}_slots_ray_calls"] = over2
            out[f"overhead_us_ray_{n}_slots_unbatched"] = over1
            print(f"  ray, {n} slots on 1 actor: overhead {over:+.1f} us/step (goal <= 200); a Ray call a batch "
                  f"{over2:+.1f} us/step ({t2 / t:.1f}x the time); one Ray call a step {over1:+.1f} us/step "
                  f"({t1 / t:.1f}x)")
        ray.shutdown()
    except ImportError:
        print("  ray not installed: skipped the ray backend")
    ceiling = cpu_scaling_ceiling()
    print(f"CPU scaling ceiling on this machine (2 plain busy processes vs 1): {ceiling:.2f}x")
    n_envs, steps = 4, 60
    total = n_envs * steps
    seq = sequential("bench/HeavySokoban-v0", n_envs, steps)
    print(f"CPU-heavy env, {total} steps: sequential {seq / total * 1e3:.2f} ms/step")
    for w in (1, 2):
        t = pooled("bench/HeavySokoban-v0", n_envs, steps, w)
        out[f"heavy_speedup_{w}_workers"] = seq / t
        print(f"  pool {w} worker(s): {t / total * 1e3:.2f} ms/step, speed-up {seq / t:.2f}x"
              + (f" (target >= 1.7x; {seq / t / ceiling:.0%} of the machine's ceiling)" if w == 2 else ""))
    out["cpu_scaling_ceiling"] = ceiling
    out["load_average_1min_at_end"] = os.getloadavg()[0]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "pool.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS / 'pool.json'}")


if __name__ == "__main__":
    main()
