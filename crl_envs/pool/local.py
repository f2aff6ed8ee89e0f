"""``EnvPool``: envs in worker processes, with an async per-slot API, timeouts and restarts.

Slots are spread round-robin over ``num_workers`` spawned processes. Every call has a
timeout. A worker that dies (segfault, ``kill -9``) or hangs past its timeout is killed and
restarted with its envs re-created; the calls in flight on it fail with :class:`EnvError`
naming the env id, seed and cause, so the harness records those episodes as errored.
Other workers keep running. ``close()`` reaps every process, even after crashes.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from crl_envs.pool.worker import worker_main
from crl_envs.registry import check_env_id

_CTX = mp.get_context("spawn")


class EnvError(RuntimeError):
    """An env call failed: the env raised, its worker died, or the call timed out.

    Attributes:
        env_id, seed, slot: which episode was hit.
        cause: ``"exception"``, ``"crash"`` or ``"timeout"``.
    """

    def __init__(self, env_id: str, seed: int | None, slot: int, cause: str, detail: str):
        self.env_id, self.seed, self.slot, self.cause, self.detail = env_id, seed, slot, cause, detail
        super().__init__(f"{env_id} (slot {slot}, seed {seed}): {cause}: {detail}")


def parse_envs(envs: list[tuple[str, dict[str, Any]] | str]) -> list[tuple[str, dict[str, Any]]]:
    """Normalise ``envs`` to ``(env_id, kwargs)`` pairs, checking every id up front."""
    pairs = [(e, {}) if isinstance(e, str) else (e[0], dict(e[1])) for e in envs]
    if not pairs:
        raise ValueError("EnvPool needs at least one env")
    for env_id, _ in pairs:
        check_env_id(env_id)
    return pairs


@dataclass
class _Slot:
    env_id: str
    kwargs: dict[str, Any]
    spec: gym.envs.registration.EnvSpec
    worker: int
    seed: int | None = None


@dataclass
class _Worker:
    index: int
    process: Any = None
    conn: Any = None
    pending: dict[int, tuple[asyncio.Future, int]] = field(default_factory=dict)
    restarts: int = 0


class EnvPool:
    """Many envs, possibly of different families, in worker processes.

    Args:
        envs: ``(env_id, make_kwargs)`` pairs (or bare ids), one per slot.
        num_workers: worker processes (default: one per slot, at most 2).
        timeout: seconds a ``step``/``call`` may take before its worker is restarted.
        reset_timeout: the same for ``reset`` and env creation (first resets build caches).

    Use it as ``async with EnvPool([...]) as pool:`` or call :meth:`close`.
    """

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
        self.slots = [_Slot(i, kw, gym.spec(i), n % self.num_workers) for n, (i, kw) in enumerate(pairs)]
        self.workers = [_Worker(w) for w in range(self.num_workers)]
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._started = False

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> EnvPool:
        """Spawn the workers and create every env (called by the first request)."""
        if self._started:
            return self
        if self._closed:
            raise RuntimeError("the pool is closed")
        self._loop = asyncio.get_running_loop()
        self._started = True
        for w in self.workers:
            self._spawn(w)
        await asyncio.gather(*(self._make_envs(w) for w in self.workers))
        return self

    def _spawn(self, w: _Worker) -> None:
        parent, child = _CTX.Pipe(duplex=True)
        w.process = _CTX.Process(target=worker_main, args=(child,), daemon=True, name=f"crl-env-worker-{w.index}")
        w.process.start()
        child.close()
        w.conn = parent
        self._loop.add_reader(parent.fileno(), self._on_readable, w)

    async def _make_envs(self, w: _Worker) -> None:
        for n, s in enumerate(self.slots):
            if s.worker == w.index:
                await self._request(n, "make", (s.spec, s.kwargs), self.reset_timeout)

    def _on_readable(self, w: _Worker) -> None:
        try:
            while w.conn.poll():
                req_id, ok, payload = w.conn.recv()
                fut, slot = w.pending.pop(req_id, (None, -1))
                if fut is None or fut.done():
                    continue
                if ok:
                    fut.set_result(payload)
                else:
                    name, msg, tb = payload
                    fut.set_exception(self._error(slot, "exception", f"{name}: {msg}\n{tb}".strip()))
        except (EOFError, OSError):
            self._restart(w, "crash", f"worker process died (exit code {w.process.exitcode})")

    def _error(self, slot: int, cause: str, detail: str) -> EnvError:
        s = self.slots[slot]
        return EnvError(s.env_id, s.seed, slot, cause, detail)

    def _restart(self, w: _Worker, cause: str, detail: str) -> None:
        """Kill a dead or hung worker, fail its calls in flight, and start a fresh one."""
        self._loop.remove_reader(w.conn.fileno())
        w.conn.close()
        if w.process.is_alive():
            w.process.kill()
        w.process.join(timeout=5)
        pending, w.pending = w.pending, {}
        for fut, slot in pending.values():
            if not fut.done():
                fut.set_exception(self._error(slot, cause, detail))
        w.restarts += 1
        if not self._closed:
            self._spawn(w)
            self._loop.create_task(self._remake_quietly(w))

    async def _remake_quietly(self, w: _Worker) -> None:
        try:
            await self._make_envs(w)
        except EnvError:
            pass  # the next request on those slots reports the failure

    async def close_async(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker and reap it; safe to call twice and after crashes."""
        if self._closed:
            return
        self._closed = True
        for w in self.workers:
            if w.conn is None:
                continue
            try:
                if self._loop is not None and not self._loop.is_closed():
                    self._loop.remove_reader(w.conn.fileno())
            except (ValueError, OSError):
                pass
            try:
                w.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            w.process.join(timeout=2)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout=5)
            w.conn.close()
            w.process.close()
            for fut, slot in w.pending.values():
                if not fut.done():
                    fut.set_exception(self._error(slot, "closed", "the pool was closed"))
            w.pending.clear()

    async def __aenter__(self) -> EnvPool:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.slots)

    # ------------------------------------------------------------------ API
    async def _request(self, slot: int, method: str, args: tuple, timeout: float) -> Any:
        if not self._started:
            await self.start()
        if self._closed:
            raise self._error(slot, "closed", "the pool was closed")
        w = self.workers[self.slots[slot].worker]
        req_id = next(self._ids)
        fut = self._loop.create_future()
        w.pending[req_id] = (fut, slot)
        try:
            w.conn.send((req_id, slot, method, args))
        except (BrokenPipeError, OSError):
            self._restart(w, "crash", "worker process died")
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            if w.pending.get(req_id, (None,))[0] is fut:
                self._restart(w, "timeout", f"{method} took longer than {timeout:g} s")
            raise self._error(slot, "timeout", f"{method} took longer than {timeout:g} s") from None

    async def reset(self, slot: int, seed: int | None = None, options: dict[str, Any] | None = None):
        """``env.reset`` on one slot; returns ``(obs, info)``."""
        self.slots[slot].seed = seed
        return await self._request(slot, "reset", (seed, options), self.reset_timeout)

    async def step(self, slot: int, action: str):
        """``env.step`` on one slot; returns ``(obs, reward, terminated, truncated, info)``."""
        return await self._request(slot, "step", (action,), self.timeout)

    async def call(self, slot: int, method: str, *args: Any) -> Any:
        """Call a public method of the slot's unwrapped env, e.g. ``oracle_action``."""
        return await self._request(slot, method, args, self.timeout)

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self.workers if w.process is not None]

    def restarts(self) -> int:
        return sum(w.restarts for w in self.workers)


class SyncEnvPool:
    """A blocking facade over :class:`EnvPool` for scripts, with its own event loop."""

    def __init__(self, *args: Any, **kwargs: Any):
        self._loop = asyncio.new_event_loop()
        self.pool = EnvPool(*args, **kwargs)
        self._loop.run_until_complete(self.pool.start())

    def reset(self, slot: int, seed: int | None = None, options: dict[str, Any] | None = None):
        return self._loop.run_until_complete(self.pool.reset(slot, seed, options))

    def step(self, slot: int, action: str):
        return self._loop.run_until_complete(self.pool.step(slot, action))

    def call(self, slot: int, method: str, *args: Any) -> Any:
        return self._loop.run_until_complete(self.pool.call(slot, method, *args))

    def close(self) -> None:
        if not self._loop.is_closed():
            self.pool.close()
            self._loop.close()

    def __enter__(self) -> SyncEnvPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
