"""The :class:`~crl_envs.pool.EnvPool` API on Ray actors, for runs that span machines.

Each actor hosts several envs (slots are spread round-robin over ``num_workers`` actors),
so a run scales over a Ray cluster. Faults are handled like the process backend: a call
that times out or whose actor dies fails with :class:`EnvError`, the actor is killed and
re-created with its envs, and other actors keep running.

Needs ``ray`` (``pip install -e ".[ray]"``). Call ``ray.init(...)`` yourself to join a
cluster; otherwise a local one is started.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import gymnasium as gym

from crl_envs.pool.local import FRESH_START_METHODS, EnvError, parse_envs


def _ray():
    try:
        import ray
    except ImportError as e:
        raise gym.error.DependencyNotInstalled('the ray backend needs ray: pip install -e ".[ray]"') from e
    return ray


class _EnvHost:
    """A Ray actor body: several envs, called by slot, with the process worker's checks.

    An env whose constructor raises breaks only its own slot: its calls fail with the
    constructor's error, and non-text observations from a text env are errors of their call.
    """

    def __init__(self, specs: dict[int, tuple[Any, dict]]):
        import crl_envs  # noqa: F401 - registers ids and plugins in the actor
        from crl_envs.pool.worker import _Host

        self.host = _Host()
        for slot, (spec, kw) in specs.items():
            try:
                self.host.call(slot, "make", (spec, kw))
            except Exception:  # noqa: BLE001, S110 - reported by the slot's next call
                pass

    def call(self, slot: int, method: str, args: tuple) -> Any:
        if method == "make":
            raise AttributeError("make cannot be called through the pool")
        return self.host.call(slot, method, args)

    def pid(self) -> int:
        return os.getpid()


class RayEnvPool:
    """Same API as :class:`~crl_envs.pool.EnvPool`, backed by Ray actors."""

    def __init__(
        self,
        envs: list[tuple[str, dict[str, Any]] | str],
        num_workers: int | None = None,
        timeout: float = 60.0,
        reset_timeout: float = 300.0,
    ):
        pairs = parse_envs(envs)
        self.num_workers = max(1, min(num_workers or min(2, len(pairs)), len(pairs)))
        self.timeout, self.reset_timeout = timeout, reset_timeout
        self.slots = [(i, kw, gym.spec(i), n % self.num_workers) for n, (i, kw) in enumerate(pairs)]
        self.seeds: list[int | None] = [None] * len(pairs)
        self.active = [False] * len(pairs)  # an episode is under way on the slot
        self.lost: list[tuple[str, str] | None] = [None] * len(pairs)  # its actor was restarted mid-episode
        self.actors: list[Any] = [None] * self.num_workers
        self._restarts = 0
        self._closed = False
        self._started = False

    def _specs(self, w: int) -> dict[int, tuple[Any, dict]]:
        return {n: (spec, kw) for n, (_, kw, spec, worker) in enumerate(self.slots) if worker == w}

    def _spawn(self, w: int) -> None:
        ray = _ray()
        self.actors[w] = ray.remote(num_cpus=0)(_EnvHost).remote(self._specs(w))

    async def start(self) -> RayEnvPool:
        if self._started:
            return self
        ray = _ray()
        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        self._started = True
        for w in range(self.num_workers):
            self._spawn(w)
        await asyncio.gather(*(asyncio.wait_for(a.pid.remote(), self.reset_timeout) for a in self.actors))
        return self

    def _error(self, slot: int, cause: str, detail: str) -> EnvError:
        return EnvError(self.slots[slot][0], self.seeds[slot], slot, cause, detail)

    def _restart(self, w: int, cause: str, detail: str) -> None:
        """Replace actor ``w``; every episode it hosted is lost until its slot is reset."""
        ray = _ray()
        try:
            ray.kill(self.actors[w], no_restart=True)
        except Exception:  # noqa: BLE001, S110 - it may be dead already
            pass
        for n, (_, _, _, worker) in enumerate(self.slots):
            if worker == w and self.active[n]:
                self.active[n], self.lost[n] = False, (cause, detail)
        self._restarts += 1
        if not self._closed:
            self._spawn(w)

    async def _request(self, slot: int, method: str, args: tuple, timeout: float) -> Any:
        ray = _ray()
        if not self._started:
            await self.start()
        if self._closed:
            raise self._error(slot, "closed", "the pool was closed")
        if self.lost[slot] is not None and method not in FRESH_START_METHODS:
            cause, detail = self.lost[slot]
            raise self._error(slot, cause, f"the actor hosting this episode was restarted ({detail}); "
                                           "reset the slot to start a new episode")
        if method == "reset":  # active from the moment it is sent (see EnvPool._request)
            self.active[slot], self.lost[slot] = True, None
        w = self.slots[slot][3]
        actor = self.actors[w]
        try:
            result = await asyncio.wait_for(actor.call.remote(slot, method, args), timeout)
        except asyncio.TimeoutError:
            detail = f"{method} took longer than {timeout:g} s"
            if self.actors[w] is actor:
                self._restart(w, "timeout", detail)
            raise self._error(slot, "timeout", detail) from None
        except ray.exceptions.RayActorError as e:
            detail = f"actor died: {str(e).splitlines()[0]}"
            if self.actors[w] is actor:
                self._restart(w, "crash", detail)
            raise self._error(slot, "crash", detail) from None
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if getattr(e, "cause", None) is not None else e
            raise self._error(slot, "exception", f"{type(cause).__name__}: {cause}") from None
        return result

    async def reset(self, slot: int, seed: int | None = None, options: dict[str, Any] | None = None):
        self.seeds[slot] = seed
        return await self._request(slot, "reset", (seed, options), self.reset_timeout)

    async def step(self, slot: int, action: str):
        return await self._request(slot, "step", (action,), self.timeout)

    async def call(self, slot: int, method: str, *args: Any) -> Any:
        return await self._request(slot, method, args, self.timeout)

    def restarts(self) -> int:
        return self._restarts

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._started:
            ray = _ray()
            for a in self.actors:
                if a is not None:
                    try:
                        ray.kill(a, no_restart=True)
                    except Exception:  # noqa: BLE001, S110
                        pass

    def __len__(self) -> int:
        return len(self.slots)

    async def __aenter__(self) -> RayEnvPool:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        self.close()
