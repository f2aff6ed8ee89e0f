"""Collect concurrent ``chat`` calls into batches and run them in one worker thread.

Local backends (``transformers``, ``vllm``) generate far faster per token when several
requests share a forward pass. :class:`RequestBatcher` gives them that without changing the
async interface: each ``submit`` waits on a future; a single asyncio task takes the first
queued request, keeps collecting for ``max_wait_s`` (or until ``max_batch_size``), and hands
the batch to a synchronous ``generate_batch`` in a dedicated thread, so the event loop stays
responsive while the model runs. Requests that arrive during generation form the next batch.

**Interleaving.** A batcher built with ``interleave=`` (a predicate on requests) lets a running
batch take in short requests that arrive after it started: ``generate_batch(requests, window)``
gets a :class:`BatchWindow`; the batch calls ``window.take()`` when it can fit extra work (the
transformers backend: between decoding steps) and resolves what it took with the callbacks it got,
and ``window.deliver(i, result)`` resolves its own request ``i`` before the whole batch is done.
So a score request never waits for a long generation to finish (and, in the transformers backend, a
generation request joins the rows that are decoding). Requests the batch did not take
(and those the predicate refuses) run in the next batch, first.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

R = TypeVar("R")
T = TypeVar("T")


@dataclass
class BatchStats:
    """What the batcher has done so far (tests and benchmarks read it).

    ``offered`` counts requests put within a running batch's reach, ``interleaved`` those it took in
    (:meth:`BatchWindow.take`).
    """

    batches: int = 0
    requests: int = 0
    sizes: list[int] = field(default_factory=list)
    offered: int = 0
    interleaved: int = 0


class BatchWindow(Generic[R, T]):
    """Handed to a running batch by a batcher built with ``interleave=``: early results, late requests.

    Both methods are called from the worker thread; results reach the waiting callers on their event loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, futures: list[asyncio.Future], stats: BatchStats):
        self._loop, self._futures, self._stats = loop, futures, stats
        self._inbox: deque[tuple[R, asyncio.Future]] = deque()
        self._lock = threading.Lock()

    def deliver(self, index: int, result: T | BaseException) -> None:
        """Resolve request ``index`` of this batch now (its slot in the returned list is then ignored)."""
        self._loop.call_soon_threadsafe(_resolve, self._futures[index], result)

    def take(self, accept: Callable[[R], bool] | None = None) -> list[tuple[R, Callable[[T | BaseException], None]]]:
        """Requests that arrived since the batch started and may join it, each with the callback that resolves it.

        With ``accept``, only the requests it accepts (asked once each, in arrival order); the others stay
        offered, and run in the next batch if no later ``take`` accepts them."""
        with self._lock:
            items: list[tuple[R, asyncio.Future]] = []
            kept: deque[tuple[R, asyncio.Future]] = deque()
            for item in self._inbox:
                (items if accept is None or accept(item[0]) else kept).append(item)
            self._inbox = kept
        self._stats.interleaved += len(items)
        return [(req, self._resolver(fut)) for req, fut in items]

    def _resolver(self, fut: asyncio.Future) -> Callable[[T | BaseException], None]:
        return lambda result: self._loop.call_soon_threadsafe(_resolve, fut, result)

    def _offer(self, request: R, fut: asyncio.Future) -> None:
        with self._lock:
            self._inbox.append((request, fut))
        self._stats.offered += 1

    def _close(self) -> list[tuple[R, asyncio.Future]]:
        """What the batch did not take (called once it returned)."""
        with self._lock:
            items, self._inbox = list(self._inbox), deque()
        return items


def _resolve(fut: asyncio.Future, result: object) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


class RequestBatcher(Generic[R, T]):
    """Micro-batch requests of type ``R`` into calls of ``generate_batch(list[R]) -> list[T]``.

    Args:
        generate_batch: blocking function run in the worker thread; returns one result per request
            (an ``Exception`` instance in a slot fails only that request). A coroutine function is
            awaited on the event loop instead (it keeps its own blocking work off the loop).
        max_batch_size: most requests per call.
        max_wait_s: how long to keep collecting after the first request arrives.
        thread_name: name of the worker thread.
        interleave: requests a running batch may take in (see the module docstring); with it set,
            ``generate_batch`` is called as ``generate_batch(requests, window)``.
    """

    def __init__(
        self,
        generate_batch: Callable[[list[R]], Sequence[T | BaseException] | Awaitable[Sequence[T | BaseException]]],
        max_batch_size: int = 8,
        max_wait_s: float = 0.005,
        thread_name: str = "llm-batcher",
        interleave: Callable[[R], bool] | None = None,
    ):
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self._generate = generate_batch
        self._interleave = interleave
        self._is_async = inspect.iscoroutinefunction(generate_batch)
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._lock = threading.Lock()
        # One queue and serving task per event loop (a backend may serve several loops, e.g. an
        # HTTP server's loop and a test's asyncio.run); all of them share the one worker thread.
        self._workers: dict[asyncio.AbstractEventLoop, tuple[asyncio.Queue, asyncio.Task]] = {}
        self._closed = False
        self.stats = BatchStats()

    async def submit(self, request: R) -> T:
        """Queue one request and wait for its result."""
        if self._closed:
            raise RuntimeError("the backend is closed")
        loop = asyncio.get_running_loop()
        with self._lock:
            for other in [lp for lp in self._workers if lp.is_closed()]:
                del self._workers[other]
            queue, task = self._workers.get(loop, (None, None))
            if queue is None or task is None or task.done():
                queue = asyncio.Queue()
                self._workers[loop] = (queue, loop.create_task(self._serve(queue), name="llm-batcher"))
        fut: asyncio.Future = loop.create_future()
        await queue.put((request, fut))
        return await fut

    async def _serve(self, queue: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        carried: list[tuple[Any, asyncio.Future]] = []  # arrived while the last batch ran: they go first
        while True:
            batch, carried = carried[: self.max_batch_size], carried[self.max_batch_size:]
            if not batch:
                batch = [await queue.get()]
            deadline = loop.time() + self.max_wait_s
            while len(batch) < self.max_batch_size:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    while len(batch) < self.max_batch_size and not queue.empty():
                        batch.append(queue.get_nowait())
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), timeout))
                except asyncio.TimeoutError:
                    break
            batch = [(req, fut) for req, fut in batch if not fut.done()]
            if not batch:
                continue
            self.stats.batches += 1
            self.stats.requests += len(batch)
            self.stats.sizes.append(len(batch))
            requests = [req for req, _ in batch]
            try:
                if self._is_async:
                    results: Sequence[Any] = await self._generate(requests)
                elif self._interleave is None:
                    results = await loop.run_in_executor(self._executor, self._generate, requests)
                else:
                    results, late = await self._run_interleaved(loop, queue, batch)
                    carried += late
                if len(results) != len(batch):
                    raise RuntimeError(f"generate_batch returned {len(results)} results for {len(batch)} requests")
            except Exception as e:  # noqa: BLE001 - a failed batch fails its requests, not the batcher
                results = [e] * len(batch)
            for (_, fut), res in zip(batch, results, strict=True):
                _resolve(fut, res)

    async def _run_interleaved(self, loop, queue: asyncio.Queue, batch: list) -> tuple[Sequence[Any], list]:
        """Run ``batch`` while offering it the requests that arrive meanwhile; returns its results and the
        requests left for the next batch (refused by ``interleave``, or offered and not taken)."""
        assert self._interleave is not None
        window: BatchWindow = BatchWindow(loop, [fut for _, fut in batch], self.stats)
        running = loop.run_in_executor(self._executor, self._generate, [req for req, _ in batch], window)
        late: list[tuple[Any, asyncio.Future]] = []
        getter: asyncio.Future | None = None
        try:
            while not running.done():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({running, getter}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    # not awaited: awaiting it here would swallow a cancellation of this task; a get
                    # cancelled before it returned leaves its item in the queue
                    getter.cancel()
                elif not getter.cancelled():
                    req, fut = getter.result()
                    if self._interleave(req):
                        window._offer(req, fut)
                    else:
                        late.append((req, fut))
        except BaseException:  # the batcher is closing: nothing will run what waits here
            if getter is not None and getter.done() and not getter.cancelled():
                late.append(getter.result())
            elif getter is not None:
                getter.cancel()
            for _, fut in late + window._close():
                _resolve(fut, RuntimeError("the backend was closed before this request ran"))
            raise
        late += window._close()
        error = running.exception()
        return ([error] * len(batch) if error is not None else running.result()), late

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` in the worker thread, after the batch now running and before the next one."""
        if self._closed:
            raise RuntimeError("the backend is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def aclose(self) -> None:
        """Stop the serving tasks and the worker thread; queued requests fail (a running batch finishes)."""
        self._closed = True
        current = asyncio.get_running_loop()
        with self._lock:
            workers, self._workers = self._workers, {}
        for loop, (queue, task) in workers.items():
            if loop is current:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                self._fail_queued(queue)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)
                loop.call_soon_threadsafe(self._fail_queued, queue)
        self._executor.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _fail_queued(queue: asyncio.Queue) -> None:
        while not queue.empty():
            _, fut = queue.get_nowait()
            if not fut.done():
                fut.set_exception(RuntimeError("the backend was closed before this request ran"))
