"""``python -m crl_envs.serve`` (OpenEnv's protocol) and its Gymnasium client ``crl/Remote-v0``.

Servers run on loopback: uvicorn in a thread of this process (so the ``test/*`` toy ids registered
by conftest can be served), and once as the real ``python -m crl_envs.serve`` subprocess.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import gymnasium as gym
import pytest

pytest.importorskip("openenv", reason="serving needs openenv-core (pip install -e '.[openenv]')")

import uvicorn  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from crl_agent.agents.base import Agent, EpisodeContext, Policy  # noqa: E402
from crl_envs.registry import backend_installed  # noqa: E402
from crl_envs.remote import MAX_FRAME_BYTES, RemoteEnv, RemoteEnvError, jsonable  # noqa: E402
from crl_envs.serve import ServeConfig, create_app  # noqa: E402
from crl_envs.testing import check_text_env  # noqa: E402
from tests.net_support import free_port  # noqa: E402
from tests.toy_envs import GuessEnv  # noqa: E402

pytestmark = pytest.mark.openenv
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Seconds to wait for a reply or an event: generous, because a waiting test costs nothing once the reply comes, and
# on a loaded machine a session's first reset (a worker process importing crl_envs) took 50 s.
DEADLINE = 600


@contextlib.contextmanager
def serving(env_id: str, *, max_concurrent: int = 4, session_timeout: float | None = 60.0, **config):
    """Serve ``env_id`` on a free loopback port from a thread; yields the server's URL."""
    app = create_app(ServeConfig(env_id, **config), max_concurrent=max_concurrent, session_timeout=session_timeout)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_max_size=MAX_FRAME_BYTES))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=300)
        sock.close()


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=DEADLINE) as reply:
        return json.loads(reply.read())


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws"


def ask(ws, message: dict | str) -> dict:
    ws.send(message if isinstance(message, str) else json.dumps(message))
    return json.loads(ws.recv(timeout=DEADLINE))


def transcript(env: gym.Env, seed: int, actions: list[str]) -> list[tuple]:
    """What an agent sees playing ``actions`` from ``seed`` (``info`` as JSON, which is what crosses the wire)."""
    obs, info = env.reset(seed=seed)
    rows: list[tuple] = [("reset", obs, jsonable(info))]
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        rows.append((a, obs, float(reward), terminated, truncated, jsonable(info)))
        if terminated or truncated:
            break
    return rows


def oracle_actions(env_id: str, seed: int, n: int) -> list[str]:
    env = gym.make(env_id)
    try:
        env.reset(seed=seed)
        actions = []
        for _ in range(n):
            actions.append(env.unwrapped.oracle_action())
            if any(env.step(actions[-1])[2:4]):
                break
        return actions
    finally:
        env.close()


# ---------------------------------------------------------------- protocol
def test_health_schema_metadata_and_state_describe_the_text_env():
    with serving("crl/Sokoban-6x6-2-v0", backend="inline", max_action_chars=5000) as url:
        assert get(url + "/health")["status"] == "healthy"
        schema = get(url + "/schema")
        message = schema["action"]["properties"]["message"]
        assert message["type"] == "string" and message["maxLength"] == 5000
        observation = schema["observation"]["properties"]
        for key in ("text", "task", "admissible_actions", "info", "terminated", "truncated", "reward", "done"):
            assert key in observation, key
        meta = get(url + "/metadata")
        assert meta["name"] == "crl/Sokoban-6x6-2-v0" and "box" in meta["description"]


def test_http_state_and_schema_show_what_a_session_state_shows():
    with serving("crl/Sokoban-6x6-2-v0", backend="inline") as url, connect(ws_url(url), open_timeout=DEADLINE) as ws:
        state = get(url + "/state")  # a fresh env's (OpenEnv builds one per HTTP request)
        assert state == {"episode_id": None, "step_count": 0, "env_id": "crl/Sokoban-6x6-2-v0", "seed": None,
                         "done": False}
        assert set(get(url + "/schema")["state"]["properties"]) == set(state)
        assert ask(ws, {"type": "state"})["data"] == state
        ask(ws, {"type": "reset", "data": {"seed": 2}})
        session = ask(ws, {"type": "state"})["data"]
        assert set(session) == set(state) and session["seed"] == 2


def test_http_reset_takes_the_seed_and_http_step_points_to_the_ws_session():
    with serving("crl/Sokoban-6x6-2-v0", backend="inline") as url:
        status, body = post(url + "/reset", {"seed": 5})
        local_obs, local_info = gym.make("crl/Sokoban-6x6-2-v0").reset(seed=5)
        assert status == 200 and body["observation"]["text"] == local_obs and body["done"] is False
        assert body["observation"]["admissible_actions"] == local_info["admissible_actions"]
        status, body = post(url + "/step", {"action": {"message": "up"}})
        assert status == 409 and "/ws" in body["detail"]
        status, body = post(url + "/reset", {"seed": 1, "colour": "red"})
        assert status == 400 and "colour" in body["detail"]


def test_remote_env_passes_the_conformance_kit():
    with serving("test/Guess-v0", backend="inline") as url:
        check_text_env("crl/Remote-v0", make_kwargs={"url": url, "max_episode_steps": 12}, n_steps=6)


def test_seeds_reach_reset_and_episodes_go_on_over_one_session():
    with serving("test/Guess-v0", backend="inline") as url:
        env = gym.make("crl/Remote-v0", url=url)
        local = gym.make("test/Guess-v0")
        try:
            for seed in (3, 4, 3):  # several episodes on one session, each from its seed
                actions = ["5", "7", "2", "9", "1"]
                assert transcript(env, seed, actions) == transcript(local, seed, actions)
            state = env.unwrapped.state()
            assert state["seed"] == 3 and state["env_id"] == "test/Guess-v0" and state["step_count"] >= 1
        finally:
            env.close()


FAMILIES = {  # one short oracle episode per family (SWE: apply the fix, submit, graded in its bwrap sandbox)
    "Sokoban": ("crl/Sokoban-6x6-2-v0", 4),
    "MiniHack": ("crl/MiniHack-Room-5x5-v0", 4),
    "WebShop": ("crl/WebShop-v0", 4),
    "ALFWorld": ("crl/ALFWorld-PickPlace-v0", 4),
    "SWE": ("crl/SWE-Mini-v0", 3),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_plays_the_same_transcripts_remotely(family):
    env_id, steps = FAMILIES[family]
    if not backend_installed(env_id):
        pytest.skip(f"{env_id}: its backend is not installed")
    if family == "SWE":
        from tests.swe_support import require_bwrap

        require_bwrap()
    seed = 1
    actions = oracle_actions(env_id, seed, steps)
    local = gym.make(env_id)
    try:
        want = transcript(local, seed, actions)
    finally:
        local.close()
    with serving(env_id) as url:  # the default backend: the session's env in a worker process
        remote = gym.make("crl/Remote-v0", url=url)
        try:
            got = transcript(remote, seed, actions)
        finally:
            remote.close()
    assert got == want
    assert len(got) > 1 and got[-1][5]["valid_action"]


class DeterministicPolicy(Policy):
    """Plays admissible action ``(t * 3 + seed) % n`` at step ``t``: the same choices whatever the env id."""

    def __init__(self, seed: int):
        self.seed, self.t = seed, 0

    async def act(self, obs: str, info: dict) -> str:
        choices = info["admissible_actions"] or ["up"]
        self.t += 1
        return choices[(self.t * 3 + self.seed) % len(choices)]


class DeterministicAgent(Agent):
    name = "deterministic"

    def make_policy(self, ctx: EpisodeContext) -> Policy:
        return DeterministicPolicy(ctx.seed)


def test_eval_run_plays_a_remote_env_like_the_local_one(tmp_path, monkeypatch):
    from eval import run as eval_run
    from eval.trajectories import load_trajectories

    agent = f"{__name__}:DeterministicAgent"
    common = ["--agent", agent, "--episodes", "2", "--seed", "3", "--quiet", "--max-steps", "6"]
    assert eval_run.main([*common, "--tasks", "crl/Sokoban-6x6-2-v0", "--out", str(tmp_path / "local")]) == 0
    with serving("crl/Sokoban-6x6-2-v0") as url:
        monkeypatch.setenv("CRL_REMOTE_URL", url)
        assert eval_run.main([*common, "--tasks", "crl/Remote-v0", "--out", str(tmp_path / "remote")]) == 0

    def steps(run: str) -> list:
        records = sorted(load_trajectories(tmp_path / run), key=lambda r: r["seed"])
        return [[(s["observation"], s["action"], s["reward"], s["valid_action"]) for s in r["steps"]] for r in records]

    local, remote = steps("local"), steps("remote")
    assert local == remote and len(local) == 2 and all(len(s) == 6 for s in local)


# ---------------------------------------------------------------- failures
def test_a_crashed_env_ends_only_its_own_session():
    with serving("test/Faulty-v0", step_timeout=5.0) as url:
        a, b = RemoteEnv(url), RemoteEnv(url)
        try:
            a.reset(seed=0)
            b.reset(seed=1)
            with pytest.raises(RemoteEnvError, match=r"session ended: .*crash"):
                a.step("crash")
            assert b.step("5")[4]["valid_action"]  # the other session's episode goes on
            with pytest.raises(RemoteEnvError, match="reset"):
                a.step("5")  # the ended session is closed: no silent fresh env
            obs, _ = a.reset(seed=2)  # a reset opens a new session with a fresh worker
            assert obs == gym.make("test/Faulty-v0").reset(seed=2)[0]
            with pytest.raises(RemoteEnvError, match="EXECUTION_ERROR: .*RuntimeError: env bug"):
                a.step("raise")  # an env that raises fails the call; its session and episode go on
            assert a.step("5")[4]["valid_action"]
            with pytest.raises(RemoteEnvError, match=r"session ended: .*timeout"):
                a.step("hang")  # hung past --step-timeout: its worker is killed
            b.step("4")
            assert b.unwrapped.state()["step_count"] == 2  # the same episode, two steps in
        finally:
            a.close()
            b.close()
        assert get(url + "/health")["status"] == "healthy"


def test_hostile_messages_get_clear_errors_and_the_session_goes_on():
    with serving("test/Guess-v0", backend="inline") as url, connect(ws_url(url), open_timeout=DEADLINE, max_size=MAX_FRAME_BYTES) as ws:
        assert ask(ws, "{not json")["data"]["code"] == "INVALID_JSON"
        assert ask(ws, {"type": "dance"})["data"]["code"] == "UNKNOWN_TYPE"
        assert "reset first" in ask(ws, {"type": "step", "data": {"message": "5"}})["data"]["message"]
        assert ask(ws, {"type": "step"})["data"]["code"] == "VALIDATION_ERROR"
        for bad_seed in ("seven", -1, 1.5, True):
            reply = ask(ws, {"type": "reset", "data": {"seed": bad_seed}})
            assert reply["type"] == "error" and "seed" in reply["data"]["message"]
            assert reply["data"]["code"] == "VALIDATION_ERROR"  # bad input, as OpenEnv names it
        reply = ask(ws, {"type": "reset", "data": {"seed": 1, "colour": "red"}})
        assert reply["data"]["code"] == "VALIDATION_ERROR" and "colour" in reply["data"]["message"]
        assert ask(ws, {"type": "reset", "data": {"seed": 3}})["type"] == "observation"
        reply = ask(ws, {"type": "step", "data": {"message": "x" * 10_000_000}})  # 10 MB
        assert reply["type"] == "error" and "10,000,000 characters" in reply["data"]["message"]
        assert reply["data"]["code"] == "VALIDATION_ERROR"
        assert len(json.dumps(reply)) < 1000  # the action is not echoed back
        ws.send(b"\xff\xfe not utf-8")
        assert json.loads(ws.recv(timeout=DEADLINE))["data"]["code"] == "INVALID_JSON"
        ws.send(json.dumps({"type": "step", "data": {"message": "5"}}).encode())  # a binary frame holding JSON
        assert json.loads(ws.recv(timeout=DEADLINE))["type"] == "observation"
        assert ask(ws, {"type": "step", "data": {"message": "6"}})["data"]["observation"]["info"]["valid_action"]
        state = ask(ws, {"type": "state"})
        assert state["type"] == "state" and state["data"]["step_count"] == 2 and state["data"]["seed"] == 3
    with serving("test/Guess-v0", backend="inline") as url, connect(ws_url(url), open_timeout=DEADLINE, max_size=2**26) as ws:
        ws.send("x" * (MAX_FRAME_BYTES + 1))  # over the frame limit: the connection is closed, not the server
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=DEADLINE)
        assert get(url + "/health")["status"] == "healthy"


def test_frames_that_are_json_but_not_objects_get_an_error_and_the_session_goes_on():
    with serving("test/Guess-v0", backend="inline") as url, connect(ws_url(url), open_timeout=DEADLINE) as ws:
        assert ask(ws, {"type": "reset", "data": {"seed": 3}})["type"] == "observation"
        for frame, kind in (("[1,2,3]", "an array"), ('"hello"', "a string"), ("null", "null"), (" 7", "a number"),
                            ("true", "a boolean")):
            reply = ask(ws, frame)
            assert reply["type"] == "error" and reply["data"]["code"] == "VALIDATION_ERROR", reply
            assert f"got {kind}" in reply["data"]["message"] and "JSON object" in reply["data"]["message"]
        ws.send(b"[1]")  # a binary frame holding one
        assert json.loads(ws.recv(timeout=DEADLINE))["data"]["code"] == "VALIDATION_ERROR"
        reply = ask(ws, {"type": "step", "data": {"message": "5"}})  # the same session and episode go on
        assert reply["type"] == "observation" and reply["data"]["observation"]["info"]["valid_action"]
        assert ask(ws, {"type": "state"})["data"]["step_count"] == 1


class ForgettingEnv(GuessEnv):
    """A served env that, like many third-party envs, says ``terminated=False`` to a step after its episode ended."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated and info["valid_action"], truncated, info


if "test/Forgetting-v0" not in gym.registry:
    gym.register("test/Forgetting-v0", entry_point=f"{__name__}:ForgettingEnv", max_episode_steps=12)


@pytest.mark.parametrize("env_id", ["test/Guess-v0", "test/Forgetting-v0"])
def test_a_step_after_the_end_keeps_the_episode_over(env_id):
    with serving(env_id, backend="inline") as url, connect(ws_url(url), open_timeout=DEADLINE) as ws:
        ask(ws, {"type": "reset", "data": {"seed": 0}})
        target = gym.make("test/Guess-v0").unwrapped
        target.reset(seed=0)
        won = ask(ws, {"type": "step", "data": {"message": target.oracle_action()}})["data"]
        assert won["done"] and won["observation"]["terminated"] and won["reward"] == 1.0
        for action in ("5", target.oracle_action()):
            after = ask(ws, {"type": "step", "data": {"message": action}})["data"]
            assert after["done"] and after["observation"]["terminated"] and not after["observation"]["truncated"]
            assert after["reward"] == 0.0 and not after["observation"]["info"]["valid_action"]
            assert ask(ws, {"type": "state"})["data"]["done"]  # never flips back
        ask(ws, {"type": "reset", "data": {"seed": 0}})
        assert not ask(ws, {"type": "state"})["data"]["done"]  # until the next reset
        remote = RemoteEnv(url)
        try:
            remote.reset(seed=0)
            assert remote.step(target.oracle_action())[2]
            assert remote.step("5")[2:4] == (True, False)
            assert remote.step(["not", "text"])[2:4] == (True, False)  # an invalid move answered by the client
        finally:
            remote.close()


def test_a_step_after_truncation_keeps_the_episode_truncated():
    with serving("test/Guess-v0", backend="inline", env_kwargs={"max_episode_steps": 2}) as url:
        env = RemoteEnv(url)
        try:
            env.reset(seed=0)
            flags = [env.step("0")[2:4] for _ in range(4)]  # "0" is never the target: invalid, never a win
            assert flags == [(False, False), (False, True), (False, True), (False, True)]
            assert env.state()["done"]
        finally:
            env.close()


def test_sessions_beyond_max_concurrent_are_refused_until_one_closes():
    with serving("test/Guess-v0", backend="inline", max_concurrent=1) as url:
        first = RemoteEnv(url)
        first.reset(seed=0)
        with pytest.raises(RemoteEnvError, match="CAPACITY_REACHED"):
            RemoteEnv(url).reset(seed=0)
        assert first.step("5")[4]["valid_action"]
        first.close()
        deadline = time.monotonic() + DEADLINE
        while True:  # the server frees the session once it sees the close
            try:
                assert RemoteEnv(url).reset(seed=0)[0]
                break
            except RemoteEnvError:
                assert time.monotonic() < deadline
                time.sleep(0.1)


def env_workers(psutil) -> set[int]:
    """This process's pool workers (not multiprocessing's resource tracker, which lives as long as we do)."""
    workers = set()
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(p.cmdline()):
                workers.add(p.pid)
    return workers


def test_a_silent_session_is_closed_and_its_worker_released():
    psutil = pytest.importorskip("psutil")
    before = env_workers(psutil)
    # the idle clock starts once the server waits for the first message; 3 s leave a loaded client time to send it
    with serving("test/Guess-v0", session_timeout=3.0, max_concurrent=1) as url, \
            connect(ws_url(url), open_timeout=DEADLINE) as ws:
        assert ask(ws, {"type": "reset", "data": {"seed": 0}})["type"] == "observation"
        assert env_workers(psutil) - before  # the session's worker process
        reply = json.loads(ws.recv(timeout=DEADLINE))  # nothing sent for 3 s
        assert reply["data"]["code"] == "SESSION_TIMEOUT" and "--session-timeout" in reply["data"]["message"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=DEADLINE)
        assert closed.value.rcvd.reason == "idle timeout"
        deadline = time.monotonic() + DEADLINE
        while env_workers(psutil) - before:
            assert time.monotonic() < deadline, "the session's worker outlived it"
            time.sleep(0.1)
        assert RemoteEnv(url).reset(seed=0)[0]  # its place is free again


def test_remote_env_needs_a_url_and_names_an_unreachable_server(monkeypatch):
    monkeypatch.delenv("CRL_REMOTE_URL", raising=False)
    with pytest.raises(ValueError, match="CRL_REMOTE_URL"):
        gym.make("crl/Remote-v0")
    port = free_port()  # nothing listens there
    with pytest.raises(RemoteEnvError, match="cannot reach the env server"):
        RemoteEnv(f"http://127.0.0.1:{port}", connect_timeout=2)


# ---------------------------------------------------------------- the CLI
def test_cli_serves_an_env_that_remote_env_plays_once_it_says_so():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # the real CLI, whose print first checks whether the port accepts connections by then
    launcher = ("import builtins, socket, sys\n"
                "from crl_envs import serve\n"
                "def print(*args, **kwargs):\n"
                f"    with socket.socket() as s: listening = s.connect_ex(('127.0.0.1', {port})) == 0\n"
                "    builtins.print('listening:' if listening else 'not listening:', *args, **kwargs)\n"
                "serve.print = print\n"
                f"sys.exit(serve.main(['crl/Sokoban-6x6-2-v0', '--port', '{port}', '--max-concurrent', '2', "
                "'--backend', 'inline']))\n")
    proc = subprocess.Popen([sys.executable, "-c", launcher], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=DEADLINE)  # its imports took 44-88 s on a loaded machine (the old 60 s wait was short)
        assert first and first[0].startswith(f"listening: serving crl/Sokoban-6x6-2-v0 at {url} "), first
        assert get(url + "/health")["status"] == "healthy"  # no retries: it said so once listening
        actions = oracle_actions("crl/Sokoban-6x6-2-v0", 4, 3)
        remote = gym.make("crl/Remote-v0", url=url)
        try:
            assert transcript(remote, 4, actions) == transcript(gym.make("crl/Sokoban-6x6-2-v0"), 4, actions)
        finally:
            remote.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        proc.stdout.close()


def test_cli_refuses_a_bad_id_and_a_taken_port_in_one_line():
    bad = subprocess.run([sys.executable, "-m", "crl_envs.serve", "crl/Sokoban-6x6-2-v1"], cwd=REPO,
                         capture_output=True, text=True, timeout=DEADLINE)
    assert bad.returncode == 2 and "Did you mean: crl/Sokoban-6x6-2-v0" in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "crl_envs.serve", "crl/Sokoban-6x6-2-v0", "--port", str(port),
                              "--backend", "inline"], cwd=REPO, capture_output=True, text=True, timeout=DEADLINE)
    assert out.returncode == 1 and "serving" not in out.stdout, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0] and "--port" in lines[0]


# ---------------------------------------------------------------- the README's TRL example
def test_readme_trl_environment_factory_example_plays_a_served_level(tmp_path, monkeypatch):
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = readme.split("## Serving envs over the network (OpenEnv)", 1)[1]
    code = next(block for block in section.split("```python\n")[1:] if block.startswith("# sokoban_tools.py"))
    code = code.split("```", 1)[0]
    seed = 4
    actions = oracle_actions("crl/Sokoban-6x6-2-v0", seed, 100)
    with serving("crl/Sokoban-6x6-2-v0", backend="inline") as url:
        (tmp_path / "sokoban_tools.py").write_text(code.replace("http://127.0.0.1:8000", url), encoding="utf-8")
        monkeypatch.syspath_prepend(str(tmp_path))
        import sokoban_tools

        env = sokoban_tools.SokobanTools()  # what GRPOTrainer does: the class, built with no arguments
        try:
            first = env.reset(prompt=[{"role": "user", "content": "solve it"}], seed=seed)  # dataset columns
            assert "@" in first and env.reward == 0.0
            for a in actions:
                env.move(a)
            assert env.done and sokoban_tools.reward_func([env]) == [1.0]
            with pytest.raises(ValueError, match="over"):
                env.move("up")
        finally:
            env.env.close()
    if importlib.util.find_spec("transformers") is not None:
        # the tool schema transformers builds from the docstring (what TRL hands the chat template)
        from transformers.utils import get_json_schema

        schema = get_json_schema(sokoban_tools.SokobanTools.move)
        assert schema["function"]["name"] == "move"
        assert schema["function"]["parameters"]["properties"]["direction"]["type"] == "string"
