"""``EnvHost``: the envs one host (a worker process, a Ray actor, a thread) runs, called by slot.

Every backend serves its env calls through an ``EnvHost``, so they all apply the same checks:
an env whose constructor raised breaks only its own slot (its calls fail with the
constructor's error), a text env that returns a non-``str`` observation fails that call
instead of handing the agent something else, and private methods cannot be called.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym


def _is_text_space(space: Any) -> bool:
    from crl_envs.spaces import UnicodeText

    return isinstance(space, (UnicodeText, gym.spaces.Text))


def _check_obs(env: gym.Env, obs: Any, method: str) -> None:
    if not isinstance(obs, str) and _is_text_space(env.observation_space):
        env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
        raise TypeError(f"{env_id} returned a {type(obs).__name__} observation from {method}(); its observation "
                        "space is text, so observations must be str (fix the env)")


class EnvHost:
    """The envs of one host, by slot, and the errors of those that could not be created."""

    def __init__(self) -> None:
        self.envs: dict[int, gym.Env] = {}
        self.broken: dict[int, str] = {}

    def make(self, slot: int, spec: gym.envs.registration.EnvSpec, kwargs: dict[str, Any]) -> float | None:
        """(Re)create the env of ``slot``; on failure, record why (its later calls report it) and raise.

        Returns:
            the env's ``step_time_limit_s`` (the longest one step may legitimately take, e.g. SWE
            grading inside ``submit``), or ``None``; pools keep their step timeouts above it.
        """
        if slot in self.envs:
            self.envs.pop(slot).close()
        self.broken.pop(slot, None)
        try:
            self.envs[slot] = env = gym.make(spec, **kwargs)
        except BaseException as e:
            self.broken[slot] = f"{type(e).__name__}: {e}"
            raise
        limit = getattr(env.unwrapped, "step_time_limit_s", None)
        return float(limit) if isinstance(limit, (int, float)) and limit > 0 else None

    def call(self, slot: int, method: str, args: tuple = (), kwargs: dict[str, Any] | None = None) -> Any:
        """Serve one request: ``make``, ``reset``, ``step``, ``close`` or a public method of the unwrapped env."""
        if method == "make":
            return self.make(slot, *args)
        env = self.envs.get(slot)
        if env is None:
            why = self.broken.get(slot, "it was never created")
            raise RuntimeError(f"the env of slot {slot} could not be created ({why}); fix its constructor or kwargs")
        if method == "reset":
            seed, options = args
            obs, info = env.reset(seed=seed, options=options)
            _check_obs(env, obs, "reset")
            return obs, info
        if method == "step":
            obs, reward, term, trunc, info = env.step(args[0])
            _check_obs(env, obs, "step")
            return obs, float(reward), bool(term), bool(trunc), info
        if method == "close":
            self.envs.pop(slot).close()
            return None
        if method.startswith("_"):
            raise AttributeError(f"private method {method!r} cannot be called through the pool")
        return getattr(env.unwrapped, method)(*args, **(kwargs or {}))

    def close(self) -> None:
        """Close every env (best effort: one env's failing ``close`` does not skip the others)."""
        envs, self.envs = self.envs, {}
        for env in envs.values():
            try:
                env.close()
            except Exception:  # noqa: BLE001, S110 - best effort at exit
                pass


def answer(host: Any, slot: int, method: str, args: tuple, kwargs: dict[str, Any] | None) -> tuple[bool, bytes]:
    """Serve one call through ``host.call`` (an :class:`EnvHost`, or a Ray actor body that wraps one) where the
    env lives: ``(True, pickled result)`` or ``(False, pickled (type, message, traceback))``. The result is
    pickled on its own, so a result that cannot be sent fails only its own call."""
    try:
        result = host.call(slot, method, args, kwargs)
    except BaseException as e:  # noqa: BLE001 - the pool reports it as the call's EnvError
        return False, pickle.dumps((type(e).__name__, str(e), traceback.format_exc(limit=5)))
    try:
        return True, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - e.g. a lock or an open file in info
        return False, pickle.dumps((type(e).__name__, f"the result of {method} cannot be pickled to send it to "
                                    f"the pool ({e}); return plain Python objects", ""))


def settle(done: Any, ok: bool, payload: bytes, method: str, error: Callable[[str], Exception]) -> None:
    """Resolve a call's future (in the pool's process) with what :func:`answer` sent; ``error(detail)``
    makes the call's ``EnvError`` of cause ``exception``."""
    if done.done():  # its caller gave up
        return
    if not ok:
        name, msg, tb = pickle.loads(payload)  # noqa: S301 - our own host's error
        done.set_exception(error(f"{name}: {msg}\n{tb}".strip()))
        return
    try:
        done.set_result(pickle.loads(payload))  # noqa: S301 - our own host's answer
    except Exception as e:  # noqa: BLE001 - e.g. a class only the host can import
        done.set_exception(error(f"the result of {method} cannot be unpickled in the pool's process "
                                 f"({type(e).__name__}: {e}); return plain Python objects"))
