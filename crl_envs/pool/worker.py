"""The worker process: hosts several envs and answers requests over a pipe.

Requests are ``(req_id, slot, method, args)``; answers are ``(req_id, ok, payload)`` where
``payload`` is the result, or ``(exception type, message, traceback)`` when the env raised.
Only plain text and small Python objects cross the pipe; there is no shared memory.
"""

from __future__ import annotations

import os
import signal
import traceback
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym


def _call(envs: dict[int, gym.Env], specs: dict[int, tuple[Any, dict]], slot: int, method: str, args: tuple) -> Any:
    if method == "make":
        spec, kwargs = args
        if slot in envs:
            envs.pop(slot).close()
        specs[slot] = (spec, kwargs)
        envs[slot] = gym.make(spec, **kwargs)
        return None
    env = envs[slot]
    if method == "reset":
        seed, options = args
        return env.reset(seed=seed, options=options)
    if method == "step":
        obs, reward, term, trunc, info = env.step(args[0])
        return obs, float(reward), bool(term), bool(trunc), info
    if method == "close":
        envs.pop(slot).close()
        return None
    if method.startswith("_"):
        raise AttributeError(f"private method {method!r} cannot be called through the pool")
    return getattr(env.unwrapped, method)(*args)


def worker_main(conn: Connection) -> None:
    """Serve requests until the parent closes the pipe or sends ``None``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    import crl_envs  # noqa: F401 - registers ids and plugins in this process

    envs: dict[int, gym.Env] = {}
    specs: dict[int, tuple[Any, dict]] = {}
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg is None:
                break
            req_id, slot, method, args = msg
            try:
                result = _call(envs, specs, slot, method, args)
                reply = (req_id, True, result)
            except BaseException as e:  # noqa: BLE001 - the parent reports it as an EnvError
                reply = (req_id, False, (type(e).__name__, str(e), traceback.format_exc(limit=5)))
            try:
                conn.send(reply)
            except (BrokenPipeError, OSError):
                break
            except Exception as e:  # noqa: BLE001 - e.g. an info dict that cannot be pickled
                conn.send((req_id, False, (type(e).__name__, f"cannot send the result: {e}", "")))
    finally:
        for env in envs.values():
            try:
                env.close()
            except Exception:  # noqa: BLE001, S110 - best effort at exit
                pass
        conn.close()
        os._exit(0)
