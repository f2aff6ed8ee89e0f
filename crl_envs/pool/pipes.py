"""The pool's side of a worker's pipe: a sender thread, and how a worker's exit is described."""

from __future__ import annotations

import queue
import signal
import threading
from typing import Any


class Sender:
    """Writes pickled requests to one worker's pipe from a thread, so a full pipe never blocks the event loop."""

    def __init__(self, conn: Any, name: str):
        self.conn = conn
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (buf := self.queue.get()) is not None:
            try:
                self.conn.send_bytes(buf)
            except (OSError, ValueError):
                return  # the worker is gone: the event loop sees EOF and restarts it

    def put(self, buf: bytes) -> None:
        """Queue one pickled message; requests keep the order they were put in."""
        self.queue.put(buf)

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread after the queued messages (call after the worker is dead or told to exit)."""
        self.queue.put(None)
        self.thread.join(timeout)


def describe_exit(process: Any) -> str:
    """A worker's exit in words, e.g. "worker process was killed by SIGKILL" (for :class:`EnvError`)."""
    code = process.exitcode
    if code is None:
        return "worker process stopped answering"
    if code < 0:
        try:
            return f"worker process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker process was killed by signal {-code}"
    return f"worker process exited with code {code}"
