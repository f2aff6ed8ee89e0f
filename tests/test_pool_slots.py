"""One suite for the env-slot interface, run on every backend (inline, process, Ray).

The Ray runs are marked ``slow`` like tests/test_pool_ray.py (starting Ray takes ~10 s) and
skip without ``ray``. Backend-specific behaviour (worker restarts, memory limits, abandoned
threads) is tested in test_pool.py, test_pool_hostile.py, test_pool_ray.py and at the end here.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import gymnasium as gym
import pytest

from crl_envs.pool import BACKENDS, EnvError, InlinePool, SlotPool, make_pool
from tests.hostile_toy_envs import register

register()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOKOBAN = "crl/Sokoban-6x6-2-v0"
SLEEPY = "hostile/Sleepy-v0"


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="the ray backend needs ray (pip install -e '.[ray]')")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    yield
    ray.shutdown()


@pytest.fixture(params=[pytest.param(b, marks=pytest.mark.slow) if b == "ray" else b for b in BACKENDS])
def backend(request) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    return request.param


def _run(coro):
    return asyncio.run(coro)


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_every_backend_is_a_slot_pool_with_its_slots_named(backend):
    pool = make_pool([SOKOBAN, (SLEEPY, {})], backend)
    try:
        assert isinstance(pool, SlotPool)
        assert len(pool) == pool.num_slots == 2
        assert [pool.env_id(0), pool.env_id(1)] == [SOKOBAN, SLEEPY]
    finally:
        pool.close()


def test_results_equal_a_plain_env_on_the_same_seeds_and_actions(backend):
    moves = ["up", "left", "down", "right", "up", "up", "left", "bogus"]

    async def main():
        async with make_pool([SOKOBAN, SLEEPY], backend) as pool:
            for slot, env_id, actions in ((0, SOKOBAN, moves), (1, SLEEPY, ["3", "x", "5", "7"])):
                plain = gym.make(env_id)
                for seed in (0, 5):
                    got, want = await pool.reset(slot, seed=seed), plain.reset(seed=seed)
                    assert got[0] == want[0] and got[1] == want[1]
                    for a in actions:
                        got, want = await pool.step(slot, a), plain.step(a)
                        assert got[:4] == tuple(want[:4]) and got[4] == want[4]
                    assert await pool.call(slot, "oracle_action") == plain.unwrapped.oracle_action()

    _run(main())


def test_call_passes_arguments_and_refuses_the_pools_own_methods(backend):
    async def main():
        async with make_pool([SLEEPY], backend) as pool:
            await pool.reset(0, seed=0)
            assert await pool.call(0, "echo", 1, "a", key=[2]) == ([1, "a"], {"key": [2]})
            for bad in ("step", "reset", "close", "make", "_apply", "__class__", "no such", 3):
                with pytest.raises(ValueError, match="cannot be called through"):
                    await pool.call(0, bad)
            with pytest.raises(EnvError, match="AttributeError") as e:
                await pool.call(0, "no_such_method")
            assert e.value.cause == "exception"
            assert (await pool.step(0, "5"))[4]["valid_action"]

    _run(main())


def test_an_env_that_raises_fails_that_call_only(backend):
    async def main():
        async with make_pool([SLEEPY, SLEEPY], backend) as pool:
            await pool.reset(0, seed=4)
            await pool.reset(1, seed=4)
            with pytest.raises(EnvError, match="exception: RuntimeError: env bug") as e:
                await pool.step(0, "raise")
            assert (e.value.env_id, e.value.seed, e.value.slot, e.value.cause) == (SLEEPY, 4, 0, "exception")
            assert (await pool.step(0, "5"))[4]["valid_action"]  # the episode goes on
            assert (await pool.step(1, "5"))[4]["valid_action"]

    _run(main())


def test_a_hung_step_times_out_and_the_slot_recovers_after_reset(backend):
    async def main():
        async with make_pool([SLEEPY], backend, timeout=0.5) as pool:
            await pool.reset(0, seed=1)
            t = time.monotonic()
            with pytest.raises(EnvError) as e:
                await pool.step(0, "sleep 3")
            assert e.value.cause == "timeout" and e.value.seed == 1
            assert time.monotonic() - t < 0.5 + 2.0  # the limit plus room for a loaded machine
            with pytest.raises(EnvError, match="reset the slot") as e:  # never continued on a fresh env
                await pool.step(0, "5")
            assert e.value.cause == "timeout"
            plain = gym.make(SLEEPY)
            assert (await pool.reset(0, seed=2))[0] == plain.reset(seed=2)[0]
            assert (await pool.step(0, "5"))[:4] == tuple(plain.step("5")[:4])

    _run(main())


def test_a_slow_slot_does_not_block_another_slot(backend):
    async def main():
        async with make_pool([SLEEPY, SLEEPY], backend, num_workers=2, timeout=30) as pool:
            await pool.reset(0, seed=0)
            await pool.reset(1, seed=0)
            slow = asyncio.create_task(pool.step(0, "sleep 2"))
            await asyncio.sleep(0.05)
            for _ in range(20):
                await pool.reset(1, seed=0)
                await pool.step(1, "5")
            served_meanwhile = not slow.done()  # a blocking pool would serve them after the 2 s step
            assert (await slow)[4]["valid_action"]
            return served_meanwhile

    assert _run(main())


def test_a_step_its_env_declares_long_is_not_timed_out(backend):
    async def main():
        async with make_pool([(SLEEPY, {"step_time_limit_s": 2.0})], backend, timeout=0.3) as pool:
            await pool.reset(0, seed=0)
            assert (await pool.step(0, "sleep 1"))[4]["valid_action"]  # past `timeout`, within the env's limit

    _run(main())


def test_a_slot_outside_the_pool_is_an_index_error(backend):
    async def main():
        async with make_pool([SLEEPY, SLEEPY], backend) as pool:
            for bad in (-1, 2, "0", 1.0, None, True):
                with pytest.raises(IndexError, match=r"slots 0\.\.1"):
                    await pool.reset(bad, seed=0)
                with pytest.raises(IndexError, match=r"slots 0\.\.1"):
                    await pool.step(bad, "5")
                with pytest.raises(IndexError, match=r"slots 0\.\.1"):
                    await pool.call(bad, "oracle_action")
                with pytest.raises(IndexError, match=r"slots 0\.\.1"):
                    pool.env_id(bad)

    _run(main())


def test_a_constructor_that_raises_fails_start_and_the_other_slots_serve(backend):
    async def main():
        pool = make_pool(["hostile/RaisingCtor-v0", SLEEPY], backend, num_workers=1)
        try:
            with pytest.raises(EnvError, match="dataset is missing") as e:
                await pool.start()
            assert e.value.cause == "exception" and e.value.slot == 0
            with pytest.raises(EnvError, match="could not be created"):
                await pool.reset(0, seed=0)
            assert "Guess" in (await pool.reset(1, seed=0))[0]
        finally:
            pool.close()

    _run(main())


def test_close_leaves_no_threads_or_processes_and_later_calls_fail_as_closed(backend):
    async def main():
        pool = make_pool([SLEEPY, SLEEPY], backend, timeout=0.5)
        await pool.start()
        await pool.reset(0, seed=0)
        await pool.reset(1, seed=0)
        with pytest.raises(EnvError):
            await pool.step(0, "raise")
        with pytest.raises(EnvError, match="timeout"):
            await pool.step(1, "sleep 1")
        pool.close()
        pool.close()
        with pytest.raises(EnvError) as e:
            await pool.step(0, "5")
        assert e.value.cause == "closed"

    async def warm():  # imports, and Ray's own threads
        async with make_pool([SLEEPY], backend):
            pass

    _run(warm())
    time.sleep(0.1)
    before = (threading.active_count(), _children() if backend != "ray" else set())
    _run(main())
    assert (threading.active_count(), _children() if backend != "ray" else set()) == before


def test_make_pool_names_the_backends_and_rejects_bad_envs():
    with pytest.raises(ValueError, match="unknown pool backend 'threads'.*inline"):
        make_pool([SLEEPY], "threads")
    with pytest.raises(ValueError, match="at least one env"):
        make_pool([], "inline")
    with pytest.raises(TypeError, match="one per slot"):
        make_pool(SLEEPY, "inline")
    with pytest.raises(TypeError, match=r"\(env_id, kwargs\) pair"):
        make_pool([(SLEEPY, "kw")], "process")
    with pytest.raises(gym.error.NameNotFound, match="Did you mean"):
        make_pool(["crl/Sokoban-6x6-2-v9"], "inline")


# ---------------------------------------------------------------- inline only
def test_inline_env_calls_run_off_the_event_loop_on_one_thread_per_slot():
    loop_thread = threading.get_ident()

    async def main():
        async with InlinePool([SLEEPY, SLEEPY]) as pool:
            await pool.reset(0, seed=0)
            await pool.reset(1, seed=0)
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            tick = asyncio.create_task(ticker())
            await pool.step(0, "sleep 0.5")  # the loop keeps running meanwhile
            tick.cancel()
            threads = {s: pool._workers[s].thread.ident for s in (0, 1)}
            return ticks, threads

    ticks, threads = _run(main())
    assert ticks >= 10 and loop_thread not in threads.values() and threads[0] != threads[1]


def test_inline_abandoned_env_is_replaced_and_its_thread_exits_when_its_call_returns():
    async def main():
        async with InlinePool([SLEEPY], timeout=0.3) as pool:
            await pool.reset(0, seed=0)
            with pytest.raises(EnvError, match="abandoned"):
                await pool.step(0, "sleep 1.5")
            assert pool.stuck_threads() == 1 and pool.restarts() == 1
            await pool.reset(0, seed=0)  # a fresh env on a fresh thread, while the old one is stuck
            assert (await pool.step(0, "5"))[4]["valid_action"]
            await asyncio.sleep(2.0)
            return pool.stuck_threads()

    threads = threading.active_count()
    assert _run(main()) == 0
    assert threading.active_count() == threads


def test_inline_close_with_a_call_in_flight_fails_it_as_closed():
    async def main():
        pool = InlinePool([SLEEPY], timeout=60, close_timeout=0.1)
        await pool.start()
        await pool.reset(0, seed=0)
        slow = asyncio.create_task(pool.step(0, "sleep 1"))
        await asyncio.sleep(0.2)
        pool.close()
        with pytest.raises(EnvError) as e:
            await slow
        assert e.value.cause == "closed"
        await asyncio.sleep(1.5)  # the daemon thread finishes its call, closes its env and exits

    threads = threading.active_count()
    _run(main())
    assert threading.active_count() == threads


def test_inline_without_threads_runs_on_the_loop_with_the_same_results():
    async def main():
        async with InlinePool([SOKOBAN], threads=False) as pool:
            plain = gym.make(SOKOBAN)
            assert (await pool.reset(0, seed=3))[0] == plain.reset(seed=3)[0]
            for a in ["up", "left", "down", "right"]:
                assert (await pool.step(0, a))[:4] == tuple(plain.step(a)[:4])
            with pytest.raises(EnvError, match="AttributeError"):
                await pool.call(0, "nope")

    threads = threading.active_count()
    _run(main())
    assert threading.active_count() == threads
