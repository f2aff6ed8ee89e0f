"""Collect concurrent ``chat`` calls into batches and run them in one worker thread.

Local backends (``transformers``, ``vllm``) generate far faster per token when several
requests share a forward pass. :class:`RequestBatcher` gives them that without changing the
async interface: each ``submit`` waits on a future; a single asyncio task takes the first
queued request, keeps collecting for ``max_wait_s`` (or until ``max_batch_size``), and hands
the batch to a synchronous ``generate_batch`` in a dedicated thread, so the event loop stays
responsive while the model runs. Requests that arrive during generation form the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

R = TypeVar("R")
T = TypeVar("T")


@dataclass
class BatchStats:
    """What the batcher has done so far (tests and benchmarks read it)."""

    batches: int = 0
    requests: int = 0
    sizes: list[int] = field(default_factory=list)


class RequestBatcher(Generic[R, T]):
    """Micro-batch requests of type ``R`` into calls of ``generate_batch(list[R]) -> list[T]``.

    Args:
        generate_batch: blocking function run in the worker thread; returns one result per request
            (an ``Exception`` instance in a slot fails only that request). A coroutine function is
            awaited on the event loop instead (it keeps its own blocking work off the loop).
        max_batch_size: most requests per call.
        max_wait_s: how long to keep collecting after the first request arrives.
        thread_name: name of the worker thread.
    """

    def __init__(
        self,
        generate_batch: Callable[[list[R]], Sequence[T | BaseException] | Awaitable[Sequence[T | BaseException]]],
        max_batch_size: int = 8,
        max_wait_s: float = 0.005,
        thread_name: str = "llm-batcher",
    ):
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self._generate = generate_batch
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
        while True:
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
            batch = [(req, fut) for req, fut in batch if not fut.cancelled()]
            if not batch:
                continue
            self.stats.batches += 1
            self.stats.requests += len(batch)
            self.stats.sizes.append(len(batch))
            try:
                requests = [req for req, _ in batch]
                results: Sequence[Any] = await (
                    self._generate(requests) if self._is_async
                    else loop.run_in_executor(self._executor, self._generate, requests)
                )
                if len(results) != len(batch):
                    raise RuntimeError(f"generate_batch returned {len(results)} results for {len(batch)} requests")
            except Exception as e:  # noqa: BLE001 - a failed batch fails its requests, not the batcher
                results = [e] * len(batch)
            for (_, fut), res in zip(batch, results, strict=True):
                if fut.done():
                    continue
                if isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)

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
