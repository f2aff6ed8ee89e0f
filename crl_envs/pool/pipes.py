"""The request pipe between the pool and a worker, and how a worker's exit is described.

Requests go over their own one-way pipe as frames: an 8-byte big-endian length, then a
pickle. The pool writes them without ever blocking its event loop (:class:`RequestWriter`):
a frame is written at once when the pipe has room, else the rest waits in a buffer that the
event loop flushes when the pipe drains. So a 16 MB action, or requests piling up behind a
hung call, cannot freeze the loop and with it every timeout. Replies come back over a
second pipe as ordinary :mod:`multiprocessing` messages.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import struct
from typing import Any

_HEAD = struct.Struct("!Q")


class RequestWriter:
    """Non-blocking writes of framed requests to one worker, from the event loop."""

    def __init__(self, conn: Any, loop: asyncio.AbstractEventLoop):
        self.conn = conn  # kept so the fd stays open as long as we write to it
        self.fd = conn.fileno()
        self.loop = loop
        self.buffer = bytearray()
        os.set_blocking(self.fd, False)

    def put(self, payload: bytes) -> None:
        """Queue one pickled request; requests keep the order they were put in."""
        head = _HEAD.pack(len(payload))
        if len(payload) <= 65536:  # one write, so the worker wakes once
            self._write(head + payload)
        else:
            self._write(head)
            self._write(payload)

    def _write(self, data: bytes) -> None:
        if self.buffer:
            self.buffer += data
            return
        try:
            n = os.write(self.fd, data)
        except BlockingIOError:
            n = 0
        except OSError:
            return  # the worker is gone: the pool sees its exit and restarts it
        if n < len(data):
            self.buffer += memoryview(data)[n:]
            self.loop.add_writer(self.fd, self._flush)

    def _flush(self) -> None:
        try:
            n = os.write(self.fd, self.buffer)
        except BlockingIOError:
            return
        except OSError:
            n = len(self.buffer)
        del self.buffer[:n]
        if not self.buffer:
            self.loop.remove_writer(self.fd)

    def close(self) -> None:
        """Drop what is unsent and close the pipe."""
        if self.buffer and not self.loop.is_closed():
            self.loop.remove_writer(self.fd)
        self.buffer.clear()
        self.conn.close()


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_request(conn: Any) -> Any:
    """The next request from the pool (blocking; in the worker).

    Raises:
        EOFError: when the pool closed the pipe.
    """
    head = _read_exact(conn.fileno(), _HEAD.size)
    body = None if head is None else _read_exact(conn.fileno(), _HEAD.unpack(head)[0])
    if body is None:
        raise EOFError("the pool closed the request pipe")
    return pickle.loads(body)  # noqa: S301 - our own pool's request


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
