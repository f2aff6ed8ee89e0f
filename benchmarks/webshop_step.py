"""WebShop speed: catalog build, search latency, env steps/s, and oracle/random score.

Baselines measured in the same run:
- search: brute-force BM25 (every document scored in Python, the same formula) on the same
  queries, on the default catalog (5k products) and on a 50k-product catalog; the target is
  a bm25s p99 under 20 ms at 50k products on one core;
- steps: the raw site state machine (``WebShopSite.act`` + render, no TextEnv/TimeLimit) on
  the same fixed oracle transcript.

The process is pinned to one core. Run: ``python benchmarks/webshop_step.py [--quick]``
"""

from __future__ import annotations

import os
import sys
import time

import gymnasium as gym
import numpy as np

import crl_envs  # noqa: F401
from crl_envs.webshop.catalog import generate_catalog, load_or_generate
from crl_envs.webshop.search import BruteForceBM25
from crl_envs.webshop.shop import Shop, generated_shop
from crl_envs.webshop.site import WebShopSite
from crl_envs.webshop.solver import key_terms

QUICK = "--quick" in sys.argv


def _pcts(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs)
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def _timed(fn, queries: list[str]) -> list[float]:
    out = []
    for q in queries:
        t = time.perf_counter()
        fn(q)
        out.append((time.perf_counter() - t) * 1000)
    return out


def bench_build() -> Shop:
    t = time.perf_counter()
    generate_catalog(5000, 6000, seed=0)
    gen = time.perf_counter() - t
    t = time.perf_counter()
    load_or_generate(5000, 6000, 0)
    cached = time.perf_counter() - t
    shop = generated_shop()
    shop.engine  # noqa: B018 - builds the index
    print(f"default catalog: {len(shop.products)} products, {len(shop.goals)} instructions, "
          f"{len({p.query for p in shop.products})} product types in {len({p.category for p in shop.products})} "
          f"categories")
    print(f"build: generate {gen:.2f} s, load from disk cache {cached:.2f} s, BM25 index {shop.index_seconds:.2f} s")
    return shop


def bench_search(shop: Shop, label: str, n_fast: int, n_slow: int) -> None:
    queries = [key_terms(g) for g in shop.goals[:n_fast]]
    fast = _timed(shop.engine.search, queries)
    brute = BruteForceBM25([f"{p.title} {p.description}" for p in shop.products])
    slow = _timed(brute.search, queries[:n_slow])
    f50, f99 = _pcts(fast)
    s50, s99 = _pcts(slow)
    print(f"search {label:>14s}: bm25s p50 {f50:6.2f} ms  p99 {f99:6.2f} ms (n={len(fast)}) | brute force "
          f"p50 {s50:7.1f} ms  p99 {s99:7.1f} ms (n={len(slow)}) | speed-up p50 {s50 / f50:5.0f}x  p99 {s99 / f99:5.0f}x")
    if len(shop.products) >= 50_000:
        print(f"target: search p99 < 20 ms at 50k products on one core: {'OK' if f99 < 20 else 'MISSED'} ({f99:.2f} ms)")


def bench_steps(n_episodes: int) -> None:
    env = gym.make("crl/WebShop-v0", disable_env_checker=True)
    transcript: list[tuple[int, list[str]]] = []
    for seed in range(n_episodes):  # record a fixed oracle transcript
        env.reset(seed=seed)
        actions = []
        while True:
            a = env.unwrapped.oracle_action()
            actions.append(a)
            _, _, term, trunc, _ = env.step(a)
            if term or trunc:
                break
        transcript.append((seed, actions))
    n_steps = sum(len(a) for _, a in transcript)
    goals = env.unwrapped.goals
    shop = env.unwrapped.shop
    t = time.perf_counter()
    for seed, actions in transcript:
        site = WebShopSite(shop, goals[seed])
        for a in actions:
            site.act(a)
            site.render()
    raw = time.perf_counter() - t
    t = time.perf_counter()
    for seed, actions in transcript:
        env.reset(seed=seed)
        for a in actions:
            env.step(a)
    wrapped = time.perf_counter() - t
    print(f"steps on a fixed oracle transcript ({n_episodes} episodes, {n_steps} steps): env {n_steps / wrapped:,.0f} "
          f"steps/s ({wrapped / n_steps * 1e6:.0f} us/step incl. reset share) | raw site {n_steps / raw:,.0f} steps/s "
          f"| env/raw time ratio {wrapped / raw:.2f}x")


def bench_agents(n: int) -> None:
    env = gym.make("crl/WebShop-v0")
    rng = np.random.default_rng(0)
    for name in ("oracle", "random"):
        rewards, wins, lengths = [], 0, []
        for seed in range(n):
            _, info = env.reset(seed=seed)
            actions = 0
            while actions < 15:
                actions += 1
                if name == "oracle":
                    a = env.unwrapped.oracle_action()
                else:
                    a = info["admissible_actions"][rng.integers(len(info["admissible_actions"]))]
                _, r, term, trunc, info = env.step(a)
                if term or trunc:
                    break
            rewards.append(r if term else 0.0)
            wins += info["success"]
            lengths.append(actions)
        print(f"{name:6s} on the {n} test instructions: score {100 * np.mean(rewards):.1f}  success {wins / n:.1%}  "
              f"mean actions {np.mean(lengths):.1f}")


if __name__ == "__main__":
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    if hasattr(os, "getloadavg"):
        print(f"machine load average (other processes share the cores; p99s are noise-sensitive): "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    default = bench_build()
    bench_search(default, "5k products", 500, 100 if not QUICK else 20)
    t = time.perf_counter()
    products, goals = generate_catalog(50_000, 500, seed=1)
    big = Shop(products, goals, "50k")
    big.engine  # noqa: B018
    print(f"50k catalog: generate + index {time.perf_counter() - t:.1f} s (index {big.index_seconds:.1f} s)")
    bench_search(big, "50k products", 500, 30 if not QUICK else 5)
    bench_steps(200 if not QUICK else 30)
    bench_agents(500 if not QUICK else 50)
