"""``InlinePool`` (``backend="inline"``): envs in this process, each called from its own thread.

Every slot has one dedicated worker thread that creates its env and makes every call to
it, in order, so the event loop never runs env code: one slow step (an SWE grade, an
ALFWorld game generation) never freezes the other slots, the model batcher or anything
else on the loop. An env also always sees the same thread, which envs holding
thread-bound handles (e.g. an SQLite connection made in the constructor) need.

Every call has a timeout. A thread cannot be killed, so a call that runs past its timeout
*abandons* its slot's env: the call fails with :class:`EnvError` cause ``"timeout"``, the
episode is lost (the slot's next ``step``/``call`` fails with that cause until it is reset)
and the next ``reset`` builds a fresh env on a fresh thread. The stuck thread is left to
finish its call; it then closes its env and exits. (Its CPU and memory are not reclaimed
until then: an env that can truly hang forever belongs in the process backend, which kills
its worker.) An env that raises fails only that call, with cause ``"exception"``.

``close()`` stops every thread, waits a bounded time for each to close its env and exit,
and fails calls still in flight with cause ``"closed"``; a thread still inside an env call
then is a daemon thread that exits when the call returns.

With ``threads=False`` env calls run directly on the event loop: the lowest per-step
overhead, for cheap envs in tight loops, but no timeouts and a slow step blocks the loop. The
default, ``threads="auto"``, does that only for envs whose class declares
``TextEnv.fast_steps = True`` (Sokoban, MiniHack, WebShop: steps of microseconds to a few
milliseconds, where the thread hand-off, 50-100 µs, would dominate); every other env gets its thread.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import traceback
from typing import Any

from crl_envs.pool.host import EnvHost
from crl_envs.pool.slots import SlotFront, SlotTable, parse_envs
from crl_envs.registry import env_class

_TIMED_OUT = object()  # a call's outcome when its timeout fired first
_CLOSED = object()  # ... when the pool was closed under it


def _deliver(fut: asyncio.Future, outcome: tuple[bool, Any]) -> None:
    if not fut.done():  # else it timed out, was cancelled or the pool closed: the result is dropped
        fut.set_result(outcome)


def _expire(fut: asyncio.Future, why: object) -> None:
    if not fut.done():
        fut.set_result((False, why))


class _SlotThread:
    """One slot's thread: serves its env calls in order, off the event loop."""

    def __init__(self, name: str):
        self.host = EnvHost()
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def submit(self, loop: asyncio.AbstractEventLoop, slot: int, method: str, args: tuple,
               kwargs: dict[str, Any] | None) -> asyncio.Future:
        fut = loop.create_future()
        self.jobs.put((loop, fut, slot, method, args, kwargs))
        return fut

    def _serve(self) -> None:
        try:
            while (job := self.jobs.get()) is not None:
                loop, fut, slot, method, args, kwargs = job
                try:
                    outcome = (True, self.host.call(slot, method, args, kwargs))
                except BaseException as e:  # noqa: BLE001 - the pool reports it as an EnvError
                    outcome = (False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}".strip())
                try:
                    loop.call_soon_threadsafe(_deliver, fut, outcome)
                except RuntimeError:  # the loop is closed: nobody waits for this result any more
                    pass
        finally:
            self.host.close()

    def stop(self) -> None:
        """Exit after the call under way (if any): close the env, end the thread."""
        self.jobs.put(None)


class InlinePool(SlotFront):
    """Many envs in this process, each driven by its own thread (see the module docstring).

    Args:
        envs: ``(env_id, make_kwargs)`` pairs (or bare ids), one per slot.
        timeout: seconds a ``step``/``call`` may run before its env is abandoned.
        reset_timeout: the same for ``reset`` and env creation (first resets build caches).
        threads: ``True``: a thread per slot; ``False``: env calls run on the event loop itself (no
            timeouts; a slow step blocks the loop); ``"auto"`` (default): on the loop for envs that
            declare ``fast_steps``, a thread for the others.
        close_timeout: how long ``close()`` waits, in all, for the threads to close their envs.

    Use it as ``async with InlinePool([...]) as pool:`` or call :meth:`close`.
    """

    def __init__(
        self,
        envs: list[tuple[str, dict[str, Any]] | str],
        timeout: float = 60.0,
        reset_timeout: float = 300.0,
        threads: bool | str = "auto",
        close_timeout: float = 5.0,
    ):
        pairs = parse_envs(envs)
        if threads not in (True, False, "auto"):
            raise ValueError(f"threads must be True, False or 'auto', got {threads!r}")
        self._on_loop = [threads is False or (threads == "auto" and bool(getattr(env_class(e), "fast_steps", False)))
                         for e, _ in pairs]
        self.slots = SlotTable(pairs, len(pairs), "thread")  # host n is slot n's thread
        self.timeout, self.reset_timeout = timeout, reset_timeout
        self.threads, self.close_timeout = threads, close_timeout
        self._workers: list[_SlotThread | None] = [None] * len(pairs)
        self._abandoned: list[_SlotThread] = []
        self._inflight: list[asyncio.Future | None] = [None] * len(pairs)
        self._locks = [asyncio.Lock() for _ in pairs]  # one call at a time per slot
        self._host = EnvHost()  # the envs that run on the loop
        self._restarts = 0
        self._started = False
        self._closed = False

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> InlinePool:
        """Create every env (in parallel, each on its slot's thread); the first request calls it.

        Raises:
            EnvError: when an env cannot be created (its constructor raised); the other slots serve.
        """
        if self._started:
            return self
        if self._closed:
            raise RuntimeError("the pool is closed")
        self._started = True
        outcomes = await asyncio.gather(*(self._make(slot) for slot in range(len(self.slots))),
                                        return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return self

    async def _make(self, slot: int) -> None:
        s = self.slots[slot]
        if self._on_loop[slot]:
            try:  # built off the loop (WebShop builds its catalog, MiniHack loads NetHack), then served on it
                self.slots.made(slot, await asyncio.to_thread(self._host.make, slot, s.spec, s.kwargs))
            except Exception as e:  # noqa: BLE001 - the slot's next call reports it again
                raise self.slots.error(slot, "exception", f"{type(e).__name__}: {e}") from None
            return
        async with self._locks[slot]:
            if self._workers[slot] is None and not self._closed:
                await self._spawn(slot)

    async def _spawn(self, slot: int) -> _SlotThread:
        """A fresh thread for ``slot``, with its env made on it (call with the slot's lock held)."""
        s = self.slots[slot]
        worker = self._workers[slot] = _SlotThread(f"crl-env-slot-{slot}")
        self.slots.made(slot, await self._run(slot, worker, "make", (s.spec, s.kwargs), None, self.reset_timeout))
        return worker

    def _abandon(self, slot: int, cause: str, detail: str) -> None:
        """Give up the slot's thread and env (stuck in a call); its episode is lost until reset."""
        worker, self._workers[slot] = self._workers[slot], None
        if worker is not None:
            worker.stop()
            self._abandoned.append(worker)
        self._abandoned = [w for w in self._abandoned if w.thread.is_alive()]
        self.slots.lose(slot, cause, detail)
        self._restarts += 1

    def close(self) -> None:
        """Stop every thread and close every env; calls in flight fail as ``"closed"``. Safe to repeat."""
        if self._closed:
            return
        self._closed = True
        for fut in self._inflight:
            if fut is not None and not fut.done():
                try:
                    fut.set_result((False, _CLOSED))
                except RuntimeError:  # its loop is closed
                    pass
        workers = [w for w in self._workers if w is not None]
        self._workers = [None] * len(self._workers)
        for w in workers:
            w.stop()
        deadline = time.monotonic() + self.close_timeout
        for w in workers + self._abandoned:
            w.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._abandoned = [w for w in self._abandoned + workers if w.thread.is_alive()]
        self._host.close()

    def restarts(self) -> int:
        """How many envs were abandoned after a timeout (each replaced at its slot's next reset)."""
        return self._restarts

    def stuck_threads(self) -> int:
        """Abandoned threads still inside an env call (they exit when the call returns)."""
        self._abandoned = [w for w in self._abandoned if w.thread.is_alive()]
        return len(self._abandoned)

    # ------------------------------------------------------------------ API
    async def _run(self, slot: int, worker: _SlotThread, method: str, args: tuple,
                   kwargs: dict[str, Any] | None, timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        fut = worker.submit(loop, slot, method, args, kwargs)
        self._inflight[slot] = fut
        timer = loop.call_later(timeout, _expire, fut, _TIMED_OUT)
        try:
            ok, value = await fut
        finally:
            timer.cancel()
            self._inflight[slot] = None
        if ok:
            return value
        if value is _CLOSED:
            raise self.slots.error(slot, "closed", "the pool was closed")
        if value is _TIMED_OUT:
            detail = f"{method} took longer than {timeout:g} s; its env was abandoned (a fresh one is made at reset)"
            self._abandon(slot, "timeout", detail)
            raise self.slots.error(slot, "timeout", detail)
        raise self.slots.error(slot, "exception", value)

    async def _request(self, slot: int, method: str, args: tuple, timeout: float,
                       kwargs: dict[str, Any] | None = None) -> Any:
        if not self._started:
            await self.start()
        if self._closed:
            raise self.slots.error(slot, "closed", "the pool was closed")
        if self._on_loop[slot]:
            await asyncio.sleep(0)  # yield once per call, so an episode of a fast env never starves other tasks
            self.slots.begin(slot, method)
            try:
                return self._host.call(slot, method, args, kwargs)
            except Exception as e:  # noqa: BLE001 - reported like every backend's env errors
                detail = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}".strip()
                raise self.slots.error(slot, "exception", detail) from None
        async with self._locks[slot]:
            if self._closed:  # closed while this call waited for the one ahead of it
                raise self.slots.error(slot, "closed", "the pool was closed")
            # Checked under the lock: a call ahead of this one that timed out has lost the episode.
            self.slots.begin(slot, method)
            worker = self._workers[slot]
            if worker is None:  # its env was abandoned after a timeout: a fresh env for the fresh start
                worker = await self._spawn(slot)
            return await self._run(slot, worker, method, args, kwargs, timeout)
