from __future__ import annotations

import asyncio
import os
import threading
import time

import gymnasium as gym
import pytest

from crl_envs.pool import EnvError, EnvPool, SyncEnvPool

ACTIONS = ["up", "left", "down", "right", "up", "up", "left"]


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_results_through_the_pool_equal_results_in_process():
    envs = ["crl/Sokoban-6x6-2-v0", "crl/Sokoban-8x8-3-v0", "test/Guess-v0"]
    with SyncEnvPool(envs, num_workers=2) as pool:
        for slot, env_id in enumerate(envs):
            local = gym.make(env_id)
            for seed in (0, 5):
                assert pool.reset(slot, seed=seed)[0] == local.reset(seed=seed)[0]
                for a in ACTIONS if "Sokoban" in env_id else ["3", "x", "5"]:
                    got, want = pool.step(slot, a), local.step(a)
                    assert got[:4] == tuple(want[:4]) and got[4] == want[4]


def test_an_env_that_raises_is_contained():
    with SyncEnvPool(["test/Faulty-v0", "test/Guess-v0"], num_workers=1) as pool:
        pool.reset(0, seed=0)
        with pytest.raises(EnvError, match="exception: RuntimeError: env bug") as e:
            pool.step(0, "raise")
        assert e.value.env_id == "test/Faulty-v0" and e.value.seed == 0
        pool.reset(1, seed=0)
        assert pool.step(1, "5")[4]["valid_action"]
        assert pool.pool.restarts() == 0


def test_a_killed_worker_errors_its_episode_and_is_restarted():
    with SyncEnvPool(["test/Faulty-v0", "test/Guess-v0"], num_workers=2) as pool:
        pool.reset(0, seed=3)
        pool.reset(1, seed=3)
        old = pool.pool.worker_pids()
        with pytest.raises(EnvError, match="crash") as e:
            pool.step(0, "crash")
        assert e.value.cause == "crash" and e.value.seed == 3
        assert pool.pool.restarts() == 1 and pool.pool.worker_pids()[0] != old[0]
        # the other worker was untouched, and later episodes on the restarted slot are correct
        assert pool.step(1, "5")[4]["valid_action"]
        fresh = gym.make("test/Faulty-v0")
        assert pool.reset(0, seed=4)[0] == fresh.reset(seed=4)[0]
        assert pool.step(0, "5")[0] == fresh.step("5")[0]


def test_a_hung_step_times_out_within_its_limit():
    with SyncEnvPool(["test/Faulty-v0"], num_workers=1, timeout=1.0) as pool:
        pool.reset(0, seed=0)
        t = time.monotonic()
        with pytest.raises(EnvError, match="timeout"):
            pool.step(0, "hang")
        assert time.monotonic() - t < 1.0 + 4.0  # the limit plus room for a loaded machine
        pool.reset(0, seed=0)
        assert pool.step(0, "5")[4]["valid_action"]


def test_slow_slot_does_not_block_other_workers():
    async def main():
        async with EnvPool(["test/Faulty-v0", "test/Guess-v0"], num_workers=2, timeout=4.0) as pool:
            await pool.reset(0, seed=0)
            await pool.reset(1, seed=0)
            hung = asyncio.create_task(pool.step(0, "hang"))
            await asyncio.sleep(0)
            for _ in range(20):
                await pool.step(1, "5")
            served_while_hung = not hung.done()  # a blocking pool would serve them only after the timeout
            with pytest.raises(EnvError):
                await hung
            return served_while_hung

    assert asyncio.run(main())


def test_close_leaves_no_processes_threads_or_fds():
    SyncEnvPool(["test/Guess-v0"], num_workers=1).close()  # warm imports
    before = (_children(), threading.active_count(), _fds())
    pool = SyncEnvPool(["test/Faulty-v0", "test/Guess-v0"], num_workers=2)
    pool.reset(0, seed=0)
    with pytest.raises(EnvError):
        pool.step(0, "crash")
    pool.close()
    pool.close()
    assert (_children(), threading.active_count(), _fds()) == before


@pytest.mark.slow
def test_soak_5000_episodes_keeps_rss_and_fds_flat():
    import psutil

    proc = psutil.Process()

    async def main():
        async with EnvPool(["test/Guess-v0"] * 4, num_workers=2) as pool:
            async def episodes(slot, n):
                for i in range(n):
                    await pool.reset(slot, seed=i)
                    for a in "123456789":
                        if (await pool.step(slot, a))[2]:
                            break

            await asyncio.gather(*(episodes(s, 250) for s in range(4)))
            rss0, fd0 = proc.memory_info().rss, _fds()
            await asyncio.gather(*(episodes(s, 1000) for s in range(4)))
            return rss0, fd0, proc.memory_info().rss, _fds()

    rss0, fd0, rss1, fd1 = asyncio.run(main())
    print(f"soak: rss {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB, fds {fd0} -> {fd1}")
    assert fd1 == fd0 and rss1 - rss0 < 20 * 2**20


def test_vector_adapter_declares_autoreset_and_matches_single_envs():
    from gymnasium.vector import AutoresetMode

    from crl_envs.pool import PoolVectorEnv

    venv = PoolVectorEnv("test/Guess-v0", num_envs=3, num_workers=2)
    try:
        assert venv.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        obs, infos = venv.reset(seed=10)
        singles = [gym.make("test/Guess-v0") for _ in range(3)]
        assert obs == tuple(e.reset(seed=10 + i)[0] for i, e in enumerate(singles))
        targets = [e.unwrapped.target for e in singles]
        obs, rew, term, trunc, infos = venv.step(tuple(str(t) for t in targets))
        assert term.all() and (rew == 1.0).all() and infos["success"].all() and infos["_success"].all()
        # next step autoresets: actions ignored, reward 0, episode starts over
        obs, rew, term, trunc, infos = venv.step(("1", "1", "1"))
        assert not term.any() and (rew == 0).all() and all("Guess a number" in o for o in obs)
        obs, rew, term, trunc, infos = venv.step(("x", "5", "5"))
        assert list(infos["valid_action"]) == [False, True, True]
    finally:
        venv.close()
