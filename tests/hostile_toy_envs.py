"""Toy envs that misbehave on purpose, for the env pool's fault-handling tests.

Each is a :class:`~tests.toy_envs.GuessEnv` (a correct env) with one fault switched on.
They are registered under ``hostile/*`` ids by :func:`register`.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import gymnasium as gym
import numpy as np

from tests.toy_envs import GuessEnv


class SlowResetEnv(GuessEnv):
    """``reset(options={"sleep": s})`` sleeps ``s`` seconds first (for killing a worker mid-reset)."""

    def _reset_task(self, options):
        time.sleep(float((options or {}).get("sleep", 0.0)))
        return super()._reset_task(options)


class RaisingCtorEnv(GuessEnv):
    """The constructor raises (a missing dataset, a bad kwarg)."""

    def __init__(self, render_mode: str | None = None):
        raise ValueError("RaisingCtorEnv: the dataset is missing; set $TOY_DATA")


class CrashingCtorEnv(GuessEnv):
    """The constructor kills its own process (a native library that segfaults on import)."""

    def __init__(self, render_mode: str | None = None):
        os.kill(os.getpid(), signal.SIGKILL)


class LeakyMemoryEnv(GuessEnv):
    """Every step keeps another ``leak_mb`` MiB alive (an env that leaks memory)."""

    def __init__(self, leak_mb: int = 64, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        self.leak_mb = leak_mb
        self.hoard: list[np.ndarray] = []

    def step(self, action):
        self.hoard.append(np.ones(self.leak_mb * 2**20, dtype=np.uint8))  # ones: the pages are really touched
        return super().step(action)


class NonTextObsEnv(GuessEnv):
    """Declares a text observation space but returns ``None`` or an array as the observation."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return (None if action == "none" else np.zeros(3)), r, term, trunc, info


class _Unloadable:
    """Pickles fine, but unpickling raises (a class only the worker can rebuild)."""

    def __reduce__(self):
        return (_refuse, ())


def _refuse() -> Any:
    raise RuntimeError("this object can only be rebuilt inside the worker")


class BadInfoEnv(GuessEnv):
    """``info`` holds an object that cannot be pickled (``lock``) or cannot be unpickled by the pool (``unload``)."""

    def step(self, action):
        import threading

        obs, r, term, trunc, info = super().step(action)
        if action == "lock":
            info["handle"] = threading.Lock()
        if action == "unload":
            info["handle"] = _Unloadable()
        return obs, r, term, trunc, info


class ForkingEnv(GuessEnv):
    """``step("fork-crash")`` forks a child that keeps the pipe to the pool open, then kills its own process.

    The child's pid goes to ``pid_file`` so the test can end it.
    """

    def __init__(self, pid_file: str = "", render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        self.pid_file = pid_file

    def step(self, action):
        if action == "fork-crash":
            pid = os.fork()
            if pid == 0:
                time.sleep(30)  # holds every inherited fd, the pool's pipe included
                os._exit(0)
            if self.pid_file:
                with open(self.pid_file, "w") as f:
                    f.write(str(pid))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


class SleepyEnv(GuessEnv):
    """``step("sleep S")`` takes S seconds, ``step("raise")`` raises; ``echo`` returns its arguments.

    ``step_time_limit_s`` (a kwarg) declares how long a step may legitimately take, as SWE does.
    """

    def __init__(self, step_time_limit_s: float | None = None, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        self.step_time_limit_s = step_time_limit_s

    def step(self, action):
        if isinstance(action, str) and action.startswith("sleep "):
            time.sleep(float(action.split()[1]))
            action = "5"
        if action == "raise":
            raise RuntimeError("env bug")
        return super().step(action)

    def echo(self, *args, **kwargs):
        return list(args), dict(kwargs)


HOSTILE_IDS = {
    "hostile/Sleepy-v0": "tests.hostile_toy_envs:SleepyEnv",
    "hostile/Forking-v0": "tests.hostile_toy_envs:ForkingEnv",
    "hostile/SlowReset-v0": "tests.hostile_toy_envs:SlowResetEnv",
    "hostile/RaisingCtor-v0": "tests.hostile_toy_envs:RaisingCtorEnv",
    "hostile/CrashingCtor-v0": "tests.hostile_toy_envs:CrashingCtorEnv",
    "hostile/LeakyMemory-v0": "tests.hostile_toy_envs:LeakyMemoryEnv",
    "hostile/NonTextObs-v0": "tests.hostile_toy_envs:NonTextObsEnv",
    "hostile/BadInfo-v0": "tests.hostile_toy_envs:BadInfoEnv",
}


def register() -> None:
    """Register the ``hostile/*`` ids (idempotent)."""
    for env_id, entry_point in HOSTILE_IDS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=entry_point, max_episode_steps=12)
