"""The Ray pool on a real multi-node cluster (``ray.cluster_utils.Cluster``: a head and two worker nodes on
this machine, one CPU each) that loses a node in the middle of a run."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import pytest

ray = pytest.importorskip("ray", reason="the ray backend needs ray (pip install -e '.[ray]')")

from ray.cluster_utils import Cluster  # noqa: E402

from crl_agent.agents.oracle import OracleAgent, OraclePolicy  # noqa: E402
from crl_envs.pool import EnvError  # noqa: E402
from crl_envs.pool.ray_pool import RayEnvPool  # noqa: E402

pytestmark = [pytest.mark.ray_cluster, pytest.mark.slow]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_ID = "crl/Sokoban-6x6-2-v0"
NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}


@pytest.fixture
def cluster(monkeypatch):
    """A head and two worker nodes; everything is shut down afterwards, whatever the test did."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        for _ in range(2):
            c.add_node(**NODE)
        c.wait_for_nodes()
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


async def until_exited(pid: int, within: float = 300.0) -> None:
    """Wait until an actor's process ``pid`` has exited. Neither ``ray.kill`` nor ``Cluster.remove_node`` waits for
    that, and until then the pool's direct socket to the actor still answers: on a loaded machine a step sent
    right after ``ray.kill`` was served 12 times in 15, so a test expecting it to fail failed."""
    psutil = pytest.importorskip("psutil")
    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:  # dead, not yet reaped by its parent
                return
        except psutil.NoSuchProcess:
            return
        assert time.monotonic() < deadline, f"actor process {pid} still runs {within:g} s after it was killed"
        await asyncio.sleep(0.05)


def worker_node_of(cluster: Cluster, node_ids: list[str | None]) -> tuple[int, object]:
    """An actor on a worker node (never the head, which the driver needs) and that node."""
    by_id = {n.node_id: n for n in cluster.worker_nodes}
    return next((w, by_id[n]) for w, n in enumerate(node_ids) if n in by_id)


def test_actors_spread_over_the_nodes_and_a_lost_nodes_episodes_fail_while_the_rest_go_on(cluster, monkeypatch):
    ray.init(address=cluster.address, log_to_driver=False)

    async def main():
        async with RayEnvPool([ENV_ID] * 6, num_workers=3, timeout=30.0) as pool:
            nodes = await pool.actor_nodes()
            assert len(set(nodes)) == 3  # one actor on each node
            first = {}
            for slot in range(6):
                first[slot] = (await pool.reset(slot, seed=slot))[0]
            w, victim = worker_node_of(cluster, nodes)
            lost = [slot for slot in range(6) if pool.slots[slot].host == w]  # slots w and w + 3
            pid = await pool.actors[w].pid.remote()
            cluster.remove_node(victim)
            await until_exited(pid)
            for slot in range(6):
                if slot in lost:
                    with pytest.raises(EnvError) as err:
                        await pool.step(slot, "up")
                    assert err.value.cause == "crash" and err.value.seed == slot
                else:
                    assert (await pool.step(slot, "up"))[4]["valid_action"]  # its episode goes on
            for slot in lost:  # a fresh start runs on a new actor, on a node that remains
                assert (await pool.reset(slot, seed=slot))[0] == first[slot]
            after = await pool.actor_nodes()
            assert victim.node_id not in after and None not in after
            assert pool.restarts() == 1

            # the cluster still lists the lost node as alive (as it may for a moment): an actor placed there
            # cannot start, its calls fail as a crash, and the next one goes to a node that remains
            listed = ray.nodes
            monkeypatch.setattr(ray, "nodes", lambda: [*listed(), {"NodeID": victim.node_id, "Alive": True,
                                                                    "Resources": {"CPU": 1.0}}])
            slot = lost[0]
            killed = pool.actors[pool.slots[slot].host]
            pid = await killed.pid.remote()
            ray.kill(killed, no_restart=True)
            await until_exited(pid)
            with pytest.raises(EnvError, match="crash"):
                await pool.step(slot, "up")  # its actor was killed; the replacement is sent to the lost node
            with pytest.raises(EnvError, match="crash: actor died: The actor is not schedulable"):
                await pool.reset(slot, seed=slot)
            assert (await pool.reset(slot, seed=slot))[0] == first[slot]
            assert victim.node_id not in await pool.actor_nodes() and pool.restarts() == 3

    asyncio.run(main())


NODE_LOST = threading.Event()  # set once the test removed a node (and whenever no test holds episodes back)
NODE_LOST.set()
HELD: set[int] = set()  # the episodes waiting for it


class HoldingOracleAgent(OracleAgent):
    """The oracle, except that episodes 2 and later wait before their first move until ``NODE_LOST`` is set, so
    the node goes while every slot holds an episode in flight, however fast or slow the machine is (with a
    fixed think time the run could finish before the node went)."""

    name = "holding-oracle"

    def make_policy(self, ctx):
        class Holding(OraclePolicy):
            async def act(self, obs, info):
                if ctx.episode_index >= 2 and not NODE_LOST.is_set():
                    HELD.add(ctx.episode_index)
                    while not NODE_LOST.is_set():
                        await asyncio.sleep(0.05)
                return await super().act(obs, info)

        return Holding(ctx)


def test_eval_run_on_ray_address_records_the_lost_nodes_episodes_as_errored_and_resume_replays_them(
        cluster, tmp_path, monkeypatch):
    import crl_envs.pool as pool_mod
    from eval import run as eval_run
    from eval.results import EpisodeLog
    from eval.trajectories import load_trajectories

    monkeypatch.setenv("RAY_ADDRESS", cluster.address)  # what a user sets to point --env-backend ray at a cluster
    assert not ray.is_initialized()
    pools = []
    real_make_pool = pool_mod.make_pool

    def make_pool(*args, **kwargs):  # keep a handle on the run's pool, to find a node that hosts an actor
        pool = real_make_pool(*args, **kwargs)
        pools.append((pool, asyncio.get_running_loop()))
        return pool

    monkeypatch.setattr(pool_mod, "make_pool", make_pool)  # eval.run opens its pools through it
    out = tmp_path / "run"
    argv = ["--agent", f"{__name__}:HoldingOracleAgent", "--tasks", ENV_ID, "--episodes", "12", "--concurrency", "4",
            "--num-workers", "3", "--env-backend", "ray", "--step-timeout", "30", "--quiet", "--out", str(out)]
    codes = []
    runner = threading.Thread(target=lambda: codes.append(eval_run.main(argv)))
    log = out / "episodes.jsonl"
    HELD.clear()
    NODE_LOST.clear()
    try:
        runner.start()
        deadline = time.monotonic() + 900  # joining the cluster and starting 3 actors took ~40 s on a loaded machine
        # episodes 0 and 1 done, and each of the 4 slots (so each of the 3 actors) holding one in flight
        while not (log.exists() and len(log.read_text().splitlines()) >= 2 and len(HELD) >= 4):
            assert runner.is_alive() and time.monotonic() < deadline, "the run did not get going"
            time.sleep(0.05)
        pool, loop = pools[0]
        nodes = asyncio.run_coroutine_threadsafe(pool.actor_nodes(), loop).result(timeout=300)
        _, victim = worker_node_of(cluster, nodes)
        cluster.remove_node(victim)
    finally:
        NODE_LOST.set()  # the held episodes play on (those on the lost node fail); never leave the run hanging
    runner.join(timeout=900)
    assert codes == [0]
    assert ray.get_runtime_context().gcs_address == cluster.address  # eval.run joined the cluster we pointed it at

    records = list(EpisodeLog(log).latest().values())
    assert len(records) == 12
    errored = [r for r in records if r["error"]]
    assert errored and all("crash" in r["error"] for r in errored), [r["error"][:200] for r in errored]
    assert all(r["success"] for r in records if not r["error"])  # the rest finished on the nodes that remain
    assert pool.restarts() >= 1

    # --resume keeps every recorded episode (errored ones included); --retry-errored plays only the errored
    # ones again, on the nodes that remain: nothing lost, nothing twice
    assert eval_run.main([*argv, "--resume"]) == 0
    assert len(log.read_text().splitlines()) == 12
    pools.clear()
    assert eval_run.main([*argv, "--resume", "--retry-errored"]) == 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 12 + len(errored)  # appended: one new record per errored episode, none for the others
    latest = EpisodeLog(log).latest()
    assert len(latest) == 12 and all(r["success"] and not r["error"] for r in latest.values())
    trajectories = load_trajectories(out)
    assert sorted(t["key"] for t in trajectories) == sorted(latest)
    assert all(t["summary"]["success"] for t in trajectories)
    task = json.loads((out / "summary.json").read_text())["tasks"][ENV_ID]
    assert (task["episodes"], task["errored"], task["success"]) == (12, 0, 1.0)
