"""An asyncio read-write lock: many readers at once, one writer alone, writers not starved."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class RWLock:
    """Readers share the lock; a writer holds it alone.

    A waiting writer blocks new readers, so a stream of searches cannot starve an update.
    Not reentrant: a task holding the read lock must not ask for the write lock.
    """

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @property
    def readers(self) -> int:
        return self._readers

    @property
    def writing(self) -> bool:
        return self._writer

    @asynccontextmanager
    async def read(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer and self._writers_waiting == 0)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[None]:
        async with self._cond:
            self._writers_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._writer and self._readers == 0)
            except BaseException:  # cancelled while waiting: let the readers it held back in
                self._writers_waiting -= 1
                self._cond.notify_all()
                raise
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            async with self._cond:
                self._writer = False
                self._cond.notify_all()
