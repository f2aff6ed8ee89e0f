"""Served envs (``crl/Remote-v0``, TRL's ``TextEnvironment``) release their sessions, let a program exit, and mark
episodes the server cut short.

A program that still holds a served env when Python exits must exit at once (a close from ``__del__`` at
interpreter teardown used to join the connection's frozen reader thread and hang forever). Each such program
runs in a subprocess against a real ``python -m crl_envs.serve`` on loopback and must be gone within
``EXIT_S`` of its last line. Episodes ended by the server (a restart, a capacity refusal, a timeout) are marked
``cut_short`` and not scored (TRL's ``None`` reward).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request

import gymnasium as gym
import pytest

pytest.importorskip("openenv", reason="serving needs openenv-core (pip install -e '.[openenv]')")

from crl_envs.integrations.trl import CUT_SHORT, EPISODE_OVER, TextEnvironment, log_cut_short  # noqa: E402
from crl_envs.remote import RemoteEnv, RemoteEnvError  # noqa: E402
from tests.net_support import free_port  # noqa: E402
from tests.test_openenv import serving  # noqa: E402

pytestmark = pytest.mark.openenv
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOKOBAN = "crl/Sokoban-6x6-1-v0"
EXIT_S = 5.0  # from a program's last line to its exit
START_S = 300  # a loaded 2-core machine can take a minute to start a server or import torch


@contextlib.contextmanager
def crl_serve(env_id: str = SOKOBAN, *, max_concurrent: int = 2, port: int | None = None):
    """A real ``python -m crl_envs.serve`` subprocess on a loopback port; yields ``(process, url)``."""
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "crl_envs.serve", env_id, "--port", str(port),
                             "--max-concurrent", str(max_concurrent), "--backend", "inline"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=5).close()
                break
            except (urllib.error.URLError, OSError):
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.2)
        yield proc, url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_to_exit(script: str, url: str, *, stdin_after_ready: str | None = None, on_ready=None) -> tuple[str, str]:
    """Run ``script`` (it gets ``URL``; it prints ``END`` as its last line, ``READY`` where it waits for stdin)
    and assert the process exits within ``EXIT_S`` of ``END``; returns its stdout and stderr."""
    code = f"URL = {url!r}\n" + textwrap.dedent(script)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.strip() == "READY":
                on_ready()
                proc.stdin.write(stdin_after_ready or "go\n")
                proc.stdin.flush()
            if line.strip() == "END":
                ended = time.monotonic()
                break
        else:
            raise AssertionError(f"the script stopped before END: {proc.wait()} {''.join(lines)} {proc.stderr.read()}")
        try:
            proc.wait(timeout=EXIT_S + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
        waited = time.monotonic() - ended
        err = proc.stderr.read()
        assert waited < EXIT_S, f"the program took {waited:.1f} s to exit after its last line (stderr: {err})"
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "Exception ignored" not in err, err
        return "".join(lines), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def sessions_free(url: str, n: int) -> None:
    """Assert ``n`` new sessions open (the server released the ones a finished program held), then close them."""
    deadline = time.monotonic() + 60
    envs = []
    try:
        while len(envs) < n:
            env = RemoteEnv(url)
            try:
                env.reset(seed=0)
                envs.append(env)
            except RemoteEnvError as e:
                assert e.code == "CAPACITY_REACHED" and time.monotonic() < deadline, e
                time.sleep(0.1)
    finally:
        for env in envs:
            env.close()


# ---------------------------------------------------------------- exiting without close()
PROGRAMS = {
    "trl": """
        from crl_envs.integrations.trl import environment_factory
        env = environment_factory("crl/Remote-v0", url=URL)()
        env.reset(seed=1)
        env.act("up")
        print("END", flush=True)
    """,
    "remote": """
        import gymnasium as gym
        import crl_envs
        env = gym.make("crl/Remote-v0", url=URL)
        env.reset(seed=1)
        env.step("up")
        print("END", flush=True)
    """,
    "remote_closed_in_del": """
        import gymnasium as gym
        import crl_envs

        class Tools:  # the README's environment_factory shape, closing its env when collected
            def __init__(self):
                self.env = gym.make("crl/Remote-v0", url=URL)

            def __del__(self):
                self.env.close()

        tools = Tools()
        tools.env.reset(seed=1)
        print("END", flush=True)
    """,
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_a_program_that_never_closes_its_served_envs_exits_and_frees_them(program):
    with crl_serve(max_concurrent=2) as (_, url):
        run_to_exit(PROGRAMS[program], url)
        sessions_free(url, 2)  # the exiting program's session was released


def test_a_program_exits_after_a_capacity_refusal_and_marks_the_rollout():
    script = """
        from crl_envs.integrations.trl import environment_factory
        from crl_envs.remote import RemoteEnv, RemoteEnvError
        factory = environment_factory("crl/Remote-v0", url=URL)
        held = [factory(), factory()]
        for env in held:
            env.reset(seed=1)
        refused = factory()
        print("OBS", refused.reset(seed=2).strip().replace("\\n", " "))
        print("CUT", refused.cut_short)
        print("REWARD", refused.get_reward())
        bare = RemoteEnv(URL)
        try:
            bare.reset(seed=3)
        except RemoteEnvError as e:
            print("BARE", e.code, e.session_ended)
        print("END", flush=True)
    """
    with crl_serve(max_concurrent=2) as (_, url):
        out, err = run_to_exit(script, url)
        assert "TypeError" not in err
        lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        assert lines["OBS"].startswith(CUT_SHORT) and "CAPACITY_REACHED" in lines["OBS"]
        assert lines["CUT"].startswith("CAPACITY_REACHED: ")
        assert lines["REWARD"] == "None"
        assert lines["BARE"] == "CAPACITY_REACHED True"
        sessions_free(url, 2)


def test_a_program_exits_after_its_server_died_mid_episode():
    script = """
        from crl_envs.integrations.trl import environment_factory
        env = environment_factory("crl/Remote-v0", url=URL)()
        env.reset(seed=1)
        print("READY", flush=True)
        input()
        print("OBS", env.act("up").replace("\\n", " "))
        print("CUT", env.cut_short)
        print("END", flush=True)
    """
    with crl_serve() as (server, url):
        def kill():
            server.kill()
            server.wait(timeout=30)

        out, _ = run_to_exit(script, url, on_ready=kill)
    lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert lines["OBS"].startswith(CUT_SHORT) and lines["CUT"].startswith("CONNECTION_LOST: ")


# ---------------------------------------------------------------- cut-short episodes are marked
def test_a_server_restart_mid_episode_cuts_the_episode_short_and_the_next_reset_plays_on():
    port = free_port()
    with crl_serve(port=port) as (server, url):
        env = TextEnvironment("crl/Remote-v0", url=url)
        try:
            first = env.reset(seed=4)
            env.act("up")
            env.act("left")
            server.terminate()
            server.wait(timeout=30)
            with crl_serve(port=port):  # the same address, restarted
                reply = env.act("down")
                assert reply.startswith(CUT_SHORT) and "CONNECTION_LOST" in reply
                assert env.cut_short.startswith("CONNECTION_LOST: ") and env.info["cut_short"] == env.cut_short
                assert env.done and env.steps == 2 and env.get_reward() is None  # not scored: TRL leaves it out
                assert TextEnvironment("x", score_cut_short=True).get_reward() == 0.0
                with pytest.raises(ValueError, match="ended this episode early"):
                    env.act("down")
                assert env.reset(seed=4) == first  # a new session on the restarted server
                assert env.cut_short is None and "cut_short" not in env.info and env.get_reward() == 0.0
        finally:
            env.close()


@pytest.mark.parametrize("where", ["server", "client"])
def test_a_timed_out_step_cuts_the_episode_short(where):
    """The server's ``--step-timeout`` (the env hung: its session ends) or the client's own reply timeout."""
    step_timeout, client_timeout = (2.0, 600.0) if where == "server" else (5.0, 1.0)
    with serving("test/Faulty-v0", step_timeout=step_timeout) as url:
        env = TextEnvironment("crl/Remote-v0", score_cut_short=True, url=url, timeout=client_timeout)
        try:
            env.reset(seed=0)
            env.act("5")
            reply = env.act("hang")
            assert reply.startswith(CUT_SHORT) and env.done, reply
            expected = "TIMEOUT: " if where == "client" else "session ended: "
            assert expected in env.cut_short, env.cut_short
            assert env.get_reward() == env.episode_return  # score_cut_short keeps the partial return
            assert env.reset(seed=0).strip() and env.cut_short is None
        finally:
            env.close()


def test_an_env_error_that_keeps_the_session_is_shown_to_the_model_not_marked():
    with serving("test/Faulty-v0") as url:
        env = TextEnvironment("crl/Remote-v0", url=url)
        try:
            env.reset(seed=0)
            with pytest.raises(RemoteEnvError, match="EXECUTION_ERROR") as caught:
                env.act("raise")
            assert not caught.value.session_ended and env.cut_short is None and not env.done
            assert "wrong" in env.act("5") or env.done
        finally:
            env.close()


# ---------------------------------------------------------------- the TRL surface
def test_close_is_public_but_not_one_of_the_models_tools():
    """TRL (1.16) makes every public function of the env class except reset/get_reward a tool."""
    tools = [name for name, _ in inspect.getmembers(TextEnvironment, predicate=inspect.isfunction)
             if name not in ("reset", "get_reward") and not name.startswith("_")]
    assert tools == ["act"]
    env = TextEnvironment("crl/Sokoban-6x6-1-v0")
    env.reset(seed=0)
    inner = env.env
    env.close()
    env.close()  # idempotent
    assert env.env is None and inner.unwrapped is not None
    with pytest.raises(ValueError, match=EPISODE_OVER):
        env.act("up")
    assert env.reset(seed=0)  # reopens


def test_log_cut_short_logs_the_fraction_and_never_scores():
    metrics, extra = {}, {}
    envs = [TextEnvironment(SOKOBAN) for _ in range(4)]
    envs[1].cut_short = "CONNECTION_LOST: gone"
    rewards = log_cut_short(environments=envs, log_metric=metrics.__setitem__, log_extra=extra.__setitem__,
                            prompts=[""] * 4, completions=[""] * 4)
    assert rewards == [None] * 4
    assert metrics == {"cut_short": 0.25} and extra == {"cut_short": ["", "CONNECTION_LOST: gone", "", ""]}


def test_remote_env_close_returns_at_once_after_the_server_is_gone():
    with crl_serve() as (server, url):
        env = gym.make("crl/Remote-v0", url=url)
        env.reset(seed=0)
        server.kill()
        server.wait(timeout=30)
        with pytest.raises(RemoteEnvError) as caught:
            env.step("up")
        assert caught.value.code == "CONNECTION_LOST" and caught.value.session_ended
        started = time.monotonic()
        env.close()
        assert time.monotonic() - started < 1.0
