from __future__ import annotations

import asyncio
import os

import gymnasium as gym
import pytest

ray = pytest.importorskip("ray", reason="the ray backend needs ray (pip install -e '.[ray]')")

from crl_envs.pool import EnvError  # noqa: E402
from crl_envs.pool.ray_pool import RayEnvPool  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ["RAY_AUTH_MODE"] = "disabled"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": root}})
    yield
    ray.shutdown()


@pytest.mark.parametrize("direct", [True, False], ids=["socket", "ray-calls"])
def test_ray_backend_matches_in_process_and_contains_faults(ray_cluster, direct):
    async def main():
        async with RayEnvPool(["crl/Sokoban-6x6-2-v0", "test/Faulty-v0"], num_workers=2, timeout=3.0,
                              direct=direct) as pool:
            assert pool.channels_open() == [direct, direct]
            local = gym.make("crl/Sokoban-6x6-2-v0")
            assert (await pool.reset(0, seed=2))[0] == local.reset(seed=2)[0]
            for a in ["up", "left", "down"]:
                got, want = await pool.step(0, a), local.step(a)
                assert got[:4] == tuple(want[:4])
            assert await pool.call(0, "oracle_action") in {"up", "down", "left", "right"}
            await pool.reset(1, seed=0)
            with pytest.raises(EnvError, match="exception: RuntimeError"):
                await pool.step(1, "raise")
            with pytest.raises(EnvError, match="timeout"):
                await pool.step(1, "hang")
            await pool.reset(1, seed=1)
            with pytest.raises(EnvError, match="crash|timeout"):
                await pool.step(1, "crash")
            assert pool.restarts() >= 1
            # the restarted actor serves correct episodes; the other slot kept running
            fresh = gym.make("test/Faulty-v0")
            assert (await pool.reset(1, seed=4))[0] == fresh.reset(seed=4)[0]
            assert (await pool.step(0, "right"))[4]["valid_action"]
            assert pool.channels_open() == [direct, direct]  # the new actor got its own socket

    asyncio.run(main())


def test_ray_episodes_on_a_restarted_actor_are_lost_until_reset(ray_cluster):
    async def main():
        async with RayEnvPool(["test/Faulty-v0", "test/Guess-v0", "test/Guess-v0"], num_workers=2,
                              timeout=3.0) as pool:
            for slot in range(3):
                await pool.reset(slot, seed=slot)
            # slots 0 and 2 share actor 0; slot 1 lives on actor 1
            with pytest.raises(EnvError, match="crash|timeout"):
                await pool.step(0, "crash")
            with pytest.raises(EnvError, match=r"restarted .*reset the slot") as err:
                await pool.step(2, "5")  # its episode died with the actor: never continued on a fresh env
            assert err.value.slot == 2 and err.value.seed == 2
            assert (await pool.step(1, "5"))[4]["valid_action"]  # the other actor kept its episode
            obs, _ = await pool.reset(2, seed=7)
            assert obs == gym.make("test/Guess-v0").reset(seed=7)[0]
            assert (await pool.step(2, "5"))[4]["valid_action"]

    asyncio.run(main())


def test_calls_made_together_go_to_an_actor_as_one_batch_and_fail_alone(ray_cluster):
    """Three slots on one actor step in the same turn: one Ray call carries them; the env that raises and the
    action Ray cannot send fail only their own calls, and the other slot's step is the in-process one."""
    import threading

    async def main():
        async with RayEnvPool(["test/Faulty-v0", "test/Guess-v0", "test/Guess-v0"], num_workers=1,
                              timeout=10.0) as pool:
            await asyncio.gather(*(pool.reset(i, seed=i) for i in range(3)))
            batches = []
            send = pool._send
            pool._send = lambda w: (batches.append(len(pool._queued[w])), send(w))
            got = await asyncio.gather(pool.step(0, "raise"), pool.step(1, "5"), pool.step(2, threading.Lock()),
                                       return_exceptions=True)
            assert batches[0] == 3
            assert isinstance(got[0], EnvError) and "RuntimeError" in str(got[0]) and got[0].slot == 0
            assert isinstance(got[2], EnvError) and got[2].slot == 2 and "cannot be sent" in str(got[2])
            local = gym.make("test/Guess-v0")
            local.reset(seed=1)
            want = local.step("5")
            assert got[1][:4] == tuple(want[:4]) and got[1][4] == want[4]
            assert pool.restarts() == 0
            batches.clear()
            for _ in range(3):  # steps of many slots keep going out together
                await asyncio.gather(pool.step(1, "4"), pool.step(2, "4"))
            assert batches == [2, 2, 2]

    asyncio.run(main())


def test_an_actor_the_pool_cannot_connect_to_is_served_by_ray_calls(ray_cluster, monkeypatch):
    """A firewall between the pool and an actor's node: the pool says why and sends that actor Ray calls."""
    from crl_envs.pool import ray_channel

    async def refused(*args, **kwargs):
        raise ConnectionRefusedError("port blocked")

    monkeypatch.setattr(ray_channel.Channel, "open", refused)

    async def main():
        async with RayEnvPool(["test/Guess-v0", "test/Faulty-v0"], num_workers=1, timeout=3.0) as pool:
            assert pool.channels_open() == [False]
            assert "port blocked" in pool.channel_errors[0]
            obs, _ = await pool.reset(0, seed=3)
            assert obs == gym.make("test/Guess-v0").reset(seed=3)[0]
            await pool.reset(1, seed=0)
            with pytest.raises(EnvError, match="exception: RuntimeError"):
                await pool.step(1, "raise")
            assert (await pool.step(0, "5"))[4]["valid_action"]

    asyncio.run(main())


def test_a_socket_batch_answers_each_call_in_order_and_a_dead_actor_fails_its_calls_as_a_crash(ray_cluster):
    """Over the socket: steps of three slots in one batch come back to their own callers; when the actor's
    process dies mid-batch, every call of the batch fails as a crash and the actor is replaced once."""
    async def main():
        async with RayEnvPool(["test/Guess-v0", "test/Faulty-v0", "test/Guess-v0"], num_workers=1,
                              timeout=20.0) as pool:
            assert pool.channels_open() == [True]
            await asyncio.gather(*(pool.reset(i, seed=10 + i) for i in range(3)))
            local = [gym.make("test/Guess-v0") for _ in range(2)]
            local[0].reset(seed=10)
            local[1].reset(seed=12)
            got = await asyncio.gather(pool.step(0, "3"), pool.step(2, "7"))
            assert got[0][:4] == tuple(local[0].step("3")[:4]) and got[1][:4] == tuple(local[1].step("7")[:4])
            got = await asyncio.gather(pool.step(0, "4"), pool.step(1, "crash"), pool.step(2, "4"),
                                       return_exceptions=True)
            assert all(isinstance(g, EnvError) and g.cause == "crash" for g in got), got
            assert pool.restarts() == 1
            assert (await pool.reset(0, seed=10))[0] == gym.make("test/Guess-v0").reset(seed=10)[0]
            assert pool.channels_open() == [True]

    asyncio.run(main())
