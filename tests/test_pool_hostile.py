"""EnvPool under hostile conditions not covered by test_pool.py.

Killed workers (mid-episode, mid-reset), hangs with other episodes on the same worker, big
actions queued behind a hung call, constructors that raise or crash, a leaking env, non-text
observations, and results or actions that cannot cross the pipe.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import gymnasium as gym
import pytest

from crl_envs.pool import EnvError, EnvPool, SyncEnvPool
from tests.hostile_toy_envs import register

register()


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped: the pool reaps it


def test_a_worker_killed_between_steps_errors_every_episode_it_hosted_until_each_is_reset():
    with SyncEnvPool(["test/Guess-v0", "test/Guess-v0"], num_workers=1) as pool:
        pool.reset(0, seed=1)
        pool.reset(1, seed=2)
        pool.step(1, "5")
        old = pool.pool.worker_pids()
        _kill(old[0])
        with pytest.raises(EnvError) as e:
            pool.step(0, "5")
        assert e.value.cause == "crash" and "SIGKILL" in e.value.detail and e.value.seed == 1
        # slot 1 had no call in flight, but its episode lived in the dead worker: never silently continued
        with pytest.raises(EnvError, match="reset the slot") as e:
            pool.step(1, "5")
        assert e.value.cause == "crash" and e.value.seed == 2
        with pytest.raises(EnvError, match="reset the slot"):
            pool.call(1, "oracle_action")
        assert pool.pool.restarts() == 1 and pool.pool.worker_pids() != old
        fresh = gym.make("test/Guess-v0")
        for slot in (0, 1):
            assert pool.reset(slot, seed=7)[0] == fresh.reset(seed=7)[0]
            assert pool.step(slot, "5")[:4] == fresh.step("5")[:4]
            fresh.reset(seed=7)


def test_a_worker_killed_mid_reset_fails_that_reset_and_the_slot_resets_again():
    async def main():
        async with EnvPool(["hostile/SlowReset-v0"], num_workers=1, reset_timeout=60) as pool:
            pid = pool.worker_pids()[0]
            reset = asyncio.create_task(pool.reset(0, seed=3, options={"sleep": 30}))
            await asyncio.sleep(1.0)  # the worker is inside its 30 s reset by now
            _kill(pid)
            with pytest.raises(EnvError) as e:
                await reset
            assert e.value.cause == "crash" and e.value.seed == 3
            obs, info = await pool.reset(0, seed=3)
            assert "Guess" in obs and pool.restarts() == 1 and pool.worker_pids()[0] != pid

    asyncio.run(main())


def test_a_hung_step_restarts_its_worker_and_loses_the_cohosted_episode_only():
    with SyncEnvPool(["test/Faulty-v0", "test/Guess-v0", "test/Guess-v0"], num_workers=2, timeout=1.0) as pool:
        for slot in range(3):
            pool.reset(slot, seed=slot)
        hung_worker_pid = pool.pool.worker_pids()[0]  # slots 0 and 2
        with pytest.raises(EnvError) as e:
            pool.step(0, "hang")
        assert e.value.cause == "timeout"
        with pytest.raises(EnvError, match="reset the slot") as e:
            pool.step(2, "5")
        assert e.value.cause == "timeout"
        assert pool.step(1, "5")[4]["valid_action"]  # the other worker's episode goes on
        assert pool.pool.worker_pids()[0] != hung_worker_pid and pool.pool.restarts() == 1
        pool.reset(2, seed=2)
        assert pool.step(2, "5")[4]["valid_action"]


@pytest.mark.timeout(60)
def test_a_large_action_queued_behind_a_hung_call_does_not_block_the_timeouts():
    async def main():
        async with EnvPool(["test/Faulty-v0", "test/Guess-v0"], num_workers=1, timeout=1.0) as pool:
            await pool.reset(0, seed=0)
            await pool.reset(1, seed=0)
            hung = asyncio.create_task(pool.step(0, "hang"))
            big = asyncio.create_task(pool.step(1, "x" * (16 << 20)))  # far more than a pipe holds
            results = await asyncio.gather(hung, big, return_exceptions=True)
            assert [r.cause for r in results] == ["timeout", "timeout"]
            await pool.reset(1, seed=0)
            obs, r, term, trunc, info = await pool.step(1, "x" * (16 << 20))
            assert not info["valid_action"] and "longer than" in obs

    asyncio.run(main())


def test_requests_right_after_a_restart_never_reach_an_env_before_it_is_made():
    with SyncEnvPool(["test/Faulty-v0", "test/Guess-v0", "test/Guess-v0"], num_workers=1) as pool:
        for slot in range(3):
            pool.reset(slot, seed=0)
        with pytest.raises(EnvError, match="crash"):
            pool.step(0, "crash")
        assert pool.reset(2, seed=1)[0] == gym.make("test/Guess-v0").reset(seed=1)[0]  # was KeyError: 2


def test_a_constructor_that_raises_fails_start_with_its_message_and_other_slots_serve():
    async def main():
        pool = EnvPool(["hostile/RaisingCtor-v0", "test/Guess-v0"], num_workers=1)
        try:
            with pytest.raises(EnvError, match="dataset is missing") as e:
                await pool.start()
            assert e.value.cause == "exception" and e.value.slot == 0
            with pytest.raises(EnvError, match=r"could not be created \(ValueError: RaisingCtorEnv: the dataset"):
                await pool.reset(0, seed=0)
            assert "Guess" in (await pool.reset(1, seed=0))[0]
            assert pool.restarts() == 0
        finally:
            pool.close()

    asyncio.run(main())
    with pytest.raises(EnvError, match="dataset is missing"):
        SyncEnvPool(["hostile/RaisingCtor-v0"])


def test_a_constructor_that_kills_its_worker_is_retried_once_per_request_not_in_a_loop():
    async def main():
        pool = EnvPool(["hostile/CrashingCtor-v0"], num_workers=1)
        try:
            with pytest.raises(EnvError) as e:
                await pool.start()
            assert e.value.cause == "crash" and "SIGKILL" in e.value.detail
            await asyncio.sleep(1.0)  # the old pool respawned and re-crashed here, forever
            assert pool.restarts() == 1 and pool.worker_pids() == []
            with pytest.raises(EnvError, match="crash"):
                await pool.reset(0, seed=0)
            assert pool.restarts() == 2
        finally:
            pool.close()

    threads = threading.active_count()
    asyncio.run(main())
    assert threading.active_count() == threads


def test_a_leaking_env_is_recycled_at_the_memory_limit_and_its_episode_errors():
    with SyncEnvPool([("hostile/LeakyMemory-v0", {"leak_mb": 64})], num_workers=1, max_worker_rss_mb=450) as pool:
        pool.reset(0, seed=0)
        with pytest.raises(EnvError) as e:
            for _ in range(12):  # 12 x 64 MiB would pass any limit this test could mean
                pool.step(0, "x")
        assert e.value.cause == "memory" and "max_worker_rss_mb=450" in e.value.detail
        pool.reset(0, seed=0)
        assert not pool.step(0, "x")[4]["valid_action"] and pool.pool.restarts() == 1


def test_a_non_text_observation_fails_its_own_call_and_the_worker_keeps_serving():
    with SyncEnvPool(["hostile/NonTextObs-v0"], num_workers=1) as pool:
        pool.reset(0, seed=0)
        for action, kind in (("none", "NoneType"), ("5", "ndarray")):
            with pytest.raises(EnvError, match=f"returned a {kind} observation from step") as e:
                pool.step(0, action)
            assert e.value.cause == "exception"
        assert pool.pool.restarts() == 0 and "Guess" in pool.reset(0, seed=0)[0]


def test_results_and_actions_that_cannot_cross_the_pipe_fail_only_their_call():
    with SyncEnvPool(["hostile/BadInfo-v0"], num_workers=1) as pool:
        pool.reset(0, seed=0)
        with pytest.raises(EnvError, match="the result of step cannot be pickled"):
            pool.step(0, "lock")
        with pytest.raises(EnvError, match="cannot be unpickled in the pool's process"):
            pool.step(0, "unload")
        with pytest.raises(EnvError, match="cannot be sent to the worker.*actions must be str"):
            pool.step(0, threading.Lock())
        assert pool.pool.workers[0].pending == {} and pool.pool.restarts() == 0
        assert pool.step(0, "5")[4]["valid_action"]


@pytest.mark.parametrize("action", [None, 3, b"5", ["5"], "\ud800", "5\x00", "", "x" * (1 << 20)])
def test_malformed_actions_through_the_pool_are_invalid_moves(action):
    with SyncEnvPool(["test/Guess-v0"], num_workers=1) as pool:
        pool.reset(0, seed=0)
        obs, reward, term, trunc, info = pool.step(0, action)
        assert not info["valid_action"] and reward == 0 and not term and "Invalid action" in obs
        assert pool.step(0, "5")[4]["valid_action"]


@pytest.mark.slow
def test_ray_actors_contain_raising_constructors_and_non_text_observations():
    ray = pytest.importorskip("ray", reason="the ray backend needs ray (pip install -e '.[ray]')")
    from crl_envs.pool.ray_pool import RayEnvPool

    os.environ["RAY_AUTH_MODE"] = "disabled"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": root}})

    async def main():
        pool = RayEnvPool(["hostile/RaisingCtor-v0", "hostile/NonTextObs-v0"], num_workers=1)
        try:
            with pytest.raises(EnvError, match="dataset is missing"):
                await pool.start()
            with pytest.raises(EnvError, match="could not be created.*dataset is missing"):
                await pool.reset(0, seed=0)
            await pool.reset(1, seed=0)
            with pytest.raises(EnvError, match="returned a NoneType observation"):
                await pool.step(1, "none")
            assert "Guess" in (await pool.reset(1, seed=1))[0] and pool.restarts() == 0
        finally:
            pool.close()

    try:
        asyncio.run(main())
    finally:
        ray.shutdown()


_ORPHAN_SCRIPT = """
import asyncio, sys
import gymnasium as gym
from crl_envs.pool import EnvPool
gym.register("test/Faulty-v0", entry_point="tests.toy_envs:FaultyEnv", max_episode_steps=12)

async def main():
    async with EnvPool(["test/Faulty-v0"], num_workers=1, timeout=3600) as pool:
        await pool.reset(0, seed=0)
        print(pool.worker_pids()[0], flush=True)
        await pool.step(0, "hang")

if __name__ == "__main__":
    asyncio.run(main())
"""


def test_a_worker_stuck_in_a_hung_call_exits_when_its_pool_process_is_killed(tmp_path):
    import subprocess
    import sys
    import time

    import psutil

    script = tmp_path / "pool_then_die.py"
    script.write_text(_ORPHAN_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parent = subprocess.Popen([sys.executable, str(script)], cwd=root, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": root})
    try:
        worker = psutil.Process(int(parent.stdout.readline()))
    finally:
        parent.kill()
        parent.wait()
    for _ in range(200):  # the worker polls for its parent twice a second; this loop only guards a hang
        if not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.1)
    else:
        worker.kill()
        pytest.fail("the worker outlived its pool's process (it was stuck in a hung step)")


def test_random_kills_during_concurrent_episodes_never_hang_and_every_episode_is_whole_or_errored():
    import random

    targets = {}
    for seed in range(30):
        probe = gym.make("test/Guess-v0")
        probe.reset(seed=seed)
        targets[seed] = probe.unwrapped.target

    async def main():
        outcomes = {"whole": 0, "errored": 0}
        stop = asyncio.Event()
        async with EnvPool(["test/Guess-v0"] * 6, num_workers=2, timeout=30) as pool:
            async def episodes(slot: int) -> None:
                n = 0
                while not stop.is_set():
                    seed, n = n % 30, n + 1
                    try:
                        await pool.reset(slot, seed=seed)
                        for guess in range(1, 10):
                            obs, reward, term, trunc, info = await pool.step(slot, str(guess))
                            if term:
                                break
                        # a whole episode is the right one: it ends exactly at the hidden number
                        assert term and reward == 1.0 and guess == targets[seed]
                        outcomes["whole"] += 1
                    except EnvError as e:
                        assert e.cause == "crash", e
                        outcomes["errored"] += 1

            async def killer() -> None:
                rng = random.Random(0)
                for _ in range(6):
                    await asyncio.sleep(rng.uniform(0.05, 0.3))
                    if pids := pool.worker_pids():
                        os.kill(rng.choice(pids), signal.SIGKILL)
                # let the pool recover and serve whole episodes again (a loaded machine may need longer)
                await asyncio.sleep(0.5)
                for _ in range(600):
                    if outcomes["whole"] > 6 * 30:
                        break
                    await asyncio.sleep(0.1)
                stop.set()

            await asyncio.gather(killer(), *(episodes(s) for s in range(6)))
            return outcomes, pool.restarts()

    outcomes, restarts = asyncio.run(main())
    assert outcomes["errored"] >= 1 and restarts >= 1 and outcomes["whole"] > 6 * 30


def test_vector_adapter_reports_a_crashed_sub_env_as_truncated_and_keeps_the_batch():
    from crl_envs.pool import PoolVectorEnv

    venv = PoolVectorEnv("test/Faulty-v0", num_envs=3, num_workers=3)
    try:
        venv.reset(seed=0)
        obs, rew, term, trunc, infos = venv.step(("5", "crash", "5"))
        assert list(trunc) == [False, True, False] and list(infos["_env_error"]) == [False, True, False]
        assert "crash" in infos["env_error"][1] and "environment failed" in obs[1]
        assert list(infos["valid_action"]) == [True, False, True]  # the healthy sub-envs' steps are kept
        obs, rew, term, trunc, infos = venv.step(("5", "5", "5"))  # the crashed one autoresets
        assert "Guess a number" in obs[1] and not trunc.any() and "env_error" not in infos
        assert venv.step(("5", "5", "5"))[4]["valid_action"].all()
    finally:
        venv.close()


def test_a_crash_is_seen_at_once_even_when_a_forked_child_keeps_the_pipe_open(tmp_path):
    pid_file = tmp_path / "child.pid"
    try:
        with SyncEnvPool([("hostile/Forking-v0", {"pid_file": str(pid_file)})], num_workers=1, timeout=10) as pool:
            pool.reset(0, seed=0)
            with pytest.raises(EnvError) as e:
                pool.step(0, "fork-crash")
            assert e.value.cause == "crash" and "SIGKILL" in e.value.detail  # seen at the exit, not at the timeout
            pool.reset(0, seed=0)
            assert pool.step(0, "5")[4]["valid_action"]
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_slot_outside_the_pool_is_an_index_error_not_another_slot():
    with SyncEnvPool(["test/Guess-v0", "test/Guess-v0"], num_workers=1) as pool:
        for bad in (-1, 2, "0", 1.0, None):
            with pytest.raises(IndexError, match=r"slots 0\.\.1"):
                pool.reset(bad, seed=0)
            with pytest.raises(IndexError, match=r"slots 0\.\.1"):
                pool.step(bad, "5")


def test_close_with_calls_in_flight_fails_them_as_closed_and_reaps_everything():
    async def main():
        pool = EnvPool(["test/Faulty-v0", "test/Guess-v0"], num_workers=2, timeout=600)
        await pool.start()
        await pool.reset(0, seed=0)
        await pool.reset(1, seed=0)
        hung = asyncio.create_task(pool.step(0, "hang"))
        await asyncio.sleep(0.5)  # the worker is inside the hung step by now
        pool.close()
        with pytest.raises(EnvError) as e:
            await hung
        assert e.value.cause == "closed"
        with pytest.raises(EnvError, match="closed"):
            await pool.step(1, "5")

    threads = threading.active_count()
    asyncio.run(main())
    assert threading.active_count() == threads
