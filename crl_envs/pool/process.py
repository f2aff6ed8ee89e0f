"""``ProcessPool`` (``backend="process"``): envs in worker processes, with timeouts and restarts.

It implements :class:`~crl_envs.pool.base.SlotPool`. ``EnvPool`` is the same class under the
name it had before the inline and Ray backends joined it (``from crl_envs.pool import EnvPool``
keeps working); this module was ``crl_envs.pool.local`` until "local" came to read as
"in this process", which the inline backend is.

Slots are spread round-robin over ``num_workers`` spawned processes. Every call has a
timeout, counted from when the worker starts it (not while it waits behind another slot's
call on the same worker). A worker that dies (segfault, ``kill -9``), hangs past a timeout
or outgrows ``max_worker_rss_mb`` is killed and restarted with its envs re-created:

* the calls in flight on it fail with :class:`EnvError` naming the env id, seed and cause;
* every other episode it hosted is lost too, so the next ``step``/``call`` on those slots
  fails with the same cause until the slot is reset: no episode silently continues on a
  fresh env;
* a worker that dies while creating its envs (a constructor that crashes) is not respawned
  in a loop: the next request on it tries once more and fails with the cause.

Requests are written to the pipes without blocking (see :mod:`crl_envs.pool.pipes`), so a
large action or a full pipe never freezes the event loop (and with it every timeout). Other workers keep
running. ``close()`` reaps every process and thread, even after crashes.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import os
import pickle
from dataclasses import dataclass, field
from typing import Any

from crl_envs.pool.base import EnvError
from crl_envs.pool.host import settle
from crl_envs.pool.pipes import EXIT, OK, FrameReader, RequestWriter, describe_exit, dumps, reply_reader
from crl_envs.pool.slots import SlotFront, SlotTable, parse_envs
from crl_envs.pool.worker import worker_main

__all__ = ["EnvError", "EnvPool", "ProcessPool", "SyncEnvPool"]

_CTX = mp.get_context("spawn")


@dataclass
class _Call:
    slot: int
    method: str
    timeout: float  # seconds it may run, counted from when the worker begins it
    done: asyncio.Future
    deadline: float | None = None  # set when the worker begins it (event-loop time)


@dataclass
class _Worker:
    index: int
    process: Any = None
    conn: Any = None  # replies from the worker
    reader: FrameReader | None = None  # ... split into frames
    writer: RequestWriter | None = None  # requests to the worker
    pending: dict[int, _Call] = field(default_factory=dict)  # in the order the worker serves them
    making: asyncio.Task | None = None  # creating its envs
    timer: asyncio.TimerHandle | None = None  # checks the deadline of the call it is running
    exit_fd: int | None = None  # a pidfd: readable once the process has exited
    restarts: int = 0


class ProcessPool(SlotFront):
    """Many envs, possibly of different families, in worker processes.

    Args:
        envs: ``(env_id, make_kwargs)`` pairs (or bare ids), one per slot.
        num_workers: worker processes (default: one per slot, at most 2).
        timeout: seconds a ``step``/``call`` may run before its worker is restarted.
        reset_timeout: the same for ``reset`` and env creation (first resets build caches).
        max_worker_rss_mb: restart a worker whose resident memory passes this after a call
            (its episodes fail with cause ``"memory"``); ``None`` (default) for no limit.

    Use it as ``async with ProcessPool([...]) as pool:`` or call :meth:`close`.
    """

    def __init__(
        self,
        envs: list[tuple[str, dict[str, Any]] | str],
        num_workers: int | None = None,
        timeout: float = 60.0,
        reset_timeout: float = 300.0,
        max_worker_rss_mb: float | None = None,
    ):
        pairs = parse_envs(envs)
        self.num_workers = max(1, min(num_workers or min(2, len(pairs)), len(pairs)))
        self.slots = SlotTable(pairs, self.num_workers, "worker")
        self.timeout, self.reset_timeout = timeout, reset_timeout
        self.max_worker_rss_mb = max_worker_rss_mb
        self.workers = [_Worker(w) for w in range(self.num_workers)]
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._started = False

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> ProcessPool:
        """Spawn the workers and create every env (called by the first request).

        Raises:
            EnvError: when an env cannot be created (its constructor raised or crashed).
        """
        if self._started:
            return self
        if self._closed:
            raise RuntimeError("the pool is closed")
        self._loop = asyncio.get_running_loop()
        self._started = True
        for w in self.workers:
            self._spawn(w)
        errors = await asyncio.gather(*(w.making for w in self.workers))
        for error in itertools.chain.from_iterable(errors):
            raise error
        return self

    def _spawn(self, w: _Worker) -> None:
        """Start a worker and queue the creation of its envs ahead of any other request."""
        req_r, req_w = _CTX.Pipe(duplex=False)
        rep_r, rep_w = _CTX.Pipe(duplex=False)
        w.process = _CTX.Process(target=worker_main, args=(req_r, rep_w, self.max_worker_rss_mb), daemon=True,
                                 name=f"crl-env-worker-{w.index}")
        w.process.start()
        req_r.close()
        rep_w.close()
        w.conn, w.reader, w.writer = rep_r, reply_reader(rep_r.fileno()), RequestWriter(req_w, self._loop)
        self._loop.add_reader(rep_r.fileno(), self._on_readable, w)
        # the process's own exit, seen even when a child the env forked keeps the pipe (and the sentinel) open
        try:
            w.exit_fd = os.pidfd_open(w.process.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3: the sentinel, which a forked child can hold open
            w.exit_fd = None
        self._loop.add_reader(w.process.sentinel if w.exit_fd is None else w.exit_fd, self._on_exit, w, w.process)
        calls = [self._submit(w, n, "make", self.reset_timeout, specs) for n, specs in self.slots.specs(w.index).items()]
        w.making = self._loop.create_task(self._await_makes(w, calls))

    async def _await_makes(self, w: _Worker, calls: list[_Call]) -> list[EnvError]:
        errors = []
        for call in calls:
            try:
                self.slots.made(call.slot, await call.done)
            except EnvError as e:  # the slot's next request reports it again
                errors.append(e)
        return errors

    def _on_readable(self, w: _Worker) -> None:
        if w.reader is None:  # stopped in this turn of the loop
            return
        try:
            frames = w.reader.read()
        except OSError:
            frames = []
            w.reader.eof = True
        for req_id, kind, data in frames:
            if kind == EXIT:
                self._restart(w, "memory", pickle.loads(data))  # noqa: S301 - our own worker's reason
                return
            call = w.pending.pop(req_id, None)
            if call is None:
                continue
            for queued in w.pending.values():  # the worker serves in order: the next call starts now
                self._arm(w, queued)
                break
            settle(call.done, kind == OK, data, call.method,
                   lambda detail, slot=call.slot: self._error(slot, "exception", detail))
        if w.reader.eof:
            w.process.join(timeout=1)
            self._restart(w, "crash", describe_exit(w.process))

    def _arm(self, w: _Worker, call: _Call) -> None:
        """The worker begins ``call``: start its timeout.

        One timer per worker, not one per call: it fires at the earliest deadline it was set for,
        and then sets itself again for the deadline of the call running by then (a call that
        finishes costs nothing)."""
        if call.deadline is not None:
            return
        call.deadline = self._loop.time() + call.timeout
        if w.timer is None or w.timer.when() > call.deadline:
            if w.timer is not None:
                w.timer.cancel()
            w.timer = self._loop.call_at(call.deadline, self._check_deadline, w)

    def _check_deadline(self, w: _Worker) -> None:
        """The worker's timer fired: fail the call it is running if that ran past its timeout and
        restart the worker (a hung env never answers), else set the timer for that call's deadline."""
        w.timer = None
        running = next(iter(w.pending.items()), None)
        if running is None or running[1].deadline is None:
            return
        req_id, call = running
        if self._loop.time() < call.deadline:
            w.timer = self._loop.call_at(call.deadline, self._check_deadline, w)
            return
        del w.pending[req_id]
        what = f"{call.method} took longer than {call.timeout:g} s"
        if not call.done.done():
            call.done.set_exception(self._error(call.slot, "timeout", what))
        self._restart(w, "timeout", what)

    def _on_exit(self, w: _Worker, process: Any) -> None:
        self._on_readable(w)  # replies it sent before it died still count
        if w.process is process:
            process.join(timeout=1)
            self._restart(w, "crash", describe_exit(process))

    def _error(self, slot: int, cause: str, detail: str) -> EnvError:
        return self.slots.error(slot, cause, detail)

    def _stop_worker(self, w: _Worker, graceful: bool) -> None:
        """Stop ``w``'s process and close its pipes (it may be dead already)."""
        try:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(w.conn.fileno())
                self._loop.remove_reader(w.process.sentinel if w.exit_fd is None else w.exit_fd)
        except (ValueError, OSError):
            pass
        if w.timer is not None:
            w.timer.cancel()
            w.timer = None
        if w.exit_fd is not None:
            os.close(w.exit_fd)
            w.exit_fd = None
        if graceful:
            w.writer.put(dumps(None))
            w.process.join(timeout=2)
        if w.process.is_alive():
            w.process.kill()
        w.process.join(timeout=5)
        w.writer.close()
        w.conn.close()
        try:
            w.process.close()
        except ValueError:  # still running after SIGKILL (stuck in the kernel): leave it to the OS
            pass
        w.process = w.conn = w.reader = w.writer = None

    def _restart(self, w: _Worker, cause: str, detail: str) -> None:
        """Kill a dead, hung or bloated worker, fail its episodes, and start a fresh one."""
        if w.process is None:
            return
        died_while_making = w.making is not None and not w.making.done()
        self._stop_worker(w, graceful=False)
        pending, w.pending = w.pending, {}
        for call in pending.values():
            if not call.done.done():
                call.done.set_exception(self._error(call.slot, cause, detail))
        self.slots.lose(w.index, cause, detail)
        w.restarts += 1
        if not self._closed and not died_while_making:  # else the next request retries, once
            self._spawn(w)

    async def close_async(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker and reap it; safe to call twice and after crashes."""
        if self._closed:
            return
        self._closed = True
        for w in self.workers:
            if w.process is not None:
                self._stop_worker(w, graceful=True)
            for call in w.pending.values():
                if call.method == "make":
                    call.done.cancel()  # only the cancelled creation task waits for it
                elif not call.done.done():
                    call.done.set_exception(self._error(call.slot, "closed", "the pool was closed"))
            w.pending.clear()
            if w.making is not None and not w.making.done():
                w.making.cancel()

    # ------------------------------------------------------------------ API
    def _submit(self, w: _Worker, slot: int, method: str, timeout: float, args: tuple,
                kwargs: dict[str, Any] | None = None) -> _Call:
        """Queue a request to ``w`` now (synchronously, so requests keep their order)."""
        req_id = next(self._ids)
        try:
            buf = dumps((req_id, slot, method, args, kwargs))
        except Exception as e:  # noqa: BLE001 - e.g. an action that is a lock or a generator
            raise self._error(slot, "exception", f"the {method} request cannot be sent to the worker: "
                              f"{type(e).__name__}: {e} (actions must be str)") from None
        call = _Call(slot, method, timeout, self._loop.create_future())
        if not w.pending:  # else it starts when the reply to the call ahead of it arrives
            self._arm(w, call)
        w.pending[req_id] = call
        w.writer.put(buf)
        return call

    async def _request(self, slot: int, method: str, args: tuple, timeout: float,
                       kwargs: dict[str, Any] | None = None) -> Any:
        # The timeout counts from when the worker begins the call, not while it waits behind
        # calls queued ahead of it (each of those has its own). A caller that gives up cancels
        # ``done``; the reply still arrives in order and is dropped.
        s = await self._admit(slot, method)
        w = self.workers[s.host]
        if w.process is None:  # it died while creating its envs: try once more
            self._spawn(w)
        return await self._submit(w, slot, method, timeout, args, kwargs).done

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self.workers if w.process is not None]

    def restarts(self) -> int:
        return sum(w.restarts for w in self.workers)


EnvPool = ProcessPool  # its name before the other backends came; kept so users' code keeps working


class SyncEnvPool:
    """A blocking facade over :class:`ProcessPool` for scripts, with its own event loop."""

    def __init__(self, *args: Any, **kwargs: Any):
        self._loop = asyncio.new_event_loop()
        self.pool = ProcessPool(*args, **kwargs)
        try:
            self._loop.run_until_complete(self.pool.start())
        except BaseException:
            self.close()
            raise

    def reset(self, slot: int, seed: int | None = None, options: dict[str, Any] | None = None):
        return self._loop.run_until_complete(self.pool.reset(slot, seed, options))

    def step(self, slot: int, action: str):
        return self._loop.run_until_complete(self.pool.step(slot, action))

    def call(self, slot: int, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._loop.run_until_complete(self.pool.call(slot, method, *args, **kwargs))

    def close(self) -> None:
        if not self._loop.is_closed():
            self.pool.close()
            self._loop.run_until_complete(asyncio.sleep(0))  # let cancelled tasks finish
            self._loop.close()

    def __enter__(self) -> SyncEnvPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
