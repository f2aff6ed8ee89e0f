"""The pipes between the pool and a worker, and how a worker's exit is described.

Both directions carry frames on one-way pipes of their own, read in large chunks:

* a request is an 8-byte big-endian length, then the pickled ``(req_id, slot, method, args,
  kwargs)`` (or ``None``: exit);
* a reply is a 17-byte head (payload length, ``req_id``, kind: ``OK``, ``ERROR`` or ``EXIT``), then
  the payload: the pickled result, the pickled ``(type, message, traceback)`` of an error, or the
  pickled reason of an exit. The result is pickled on its own, so a result the pool cannot
  unpickle fails only its own call, and nothing is pickled twice.

The pool writes requests without ever blocking its event loop (:class:`RequestWriter`): a frame is
written at once when the pipe has room, else the rest waits in a buffer that the event loop
flushes when the pipe drains. So a 16 MB action, or requests piling up behind a hung call, cannot
freeze the loop and with it every timeout. It reads replies without blocking too
(:class:`FrameReader` on a non-blocking pipe): one read takes every reply that has arrived.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import struct
from typing import Any

_REQUEST_HEAD = struct.Struct("!Q")
_REPLY_HEAD = struct.Struct("!QqB")
OK, ERROR, EXIT = 0, 1, 2
_CHUNK = 1 << 16  # below malloc's mmap threshold: a larger read buffer costs an mmap and munmap per read


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
        head = _REQUEST_HEAD.pack(len(payload))
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


class FrameReader:
    """Splits what arrives on a pipe into frames, reading it a chunk at a time.

    Args:
        fd: the pipe's read end; made non-blocking when ``blocking`` is false (the pool's side).
        head: the frame head; its first field is the payload's length.
    """

    def __init__(self, fd: int, head: struct.Struct, blocking: bool):
        self.fd, self.head = fd, head
        self.buffer = bytearray()
        self.eof = False
        os.set_blocking(fd, blocking)

    def frames(self) -> list[tuple]:
        """Every complete frame in the buffer, as ``(*head_fields_after_length, payload)``."""
        out, pos, buf, size = [], 0, self.buffer, self.head.size
        while len(buf) - pos >= size:
            fields = self.head.unpack_from(buf, pos)
            end = pos + size + fields[0]
            if len(buf) < end:
                break
            out.append((*fields[1:], bytes(buf[pos + size:end])))
            pos = end
        del buf[:pos]
        return out

    def read(self) -> list[tuple]:
        """What has arrived: read until the pipe is empty (non-blocking) or once (blocking); sets ``eof``."""
        while True:
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                self.eof = True
                break
            self.buffer += chunk
            if len(chunk) < _CHUNK or os.get_blocking(self.fd):
                break
        return self.frames()


class RequestReader:
    """The worker's side of the request pipe: the next request, blocking until it comes."""

    def __init__(self, conn: Any):
        self.conn = conn
        self.reader = FrameReader(conn.fileno(), _REQUEST_HEAD, blocking=True)
        self.queue: list[tuple] = []

    def next(self) -> Any:
        """The next request.

        Raises:
            EOFError: when the pool closed the pipe.
        """
        while not self.queue:
            if self.reader.eof:
                raise EOFError("the pool closed the request pipe")
            self.queue = self.reader.read()
            self.queue.reverse()
        return pickle.loads(self.queue.pop()[0])  # noqa: S301 - our own pool's request


def write_reply(fd: int, req_id: int, kind: int, payload: bytes) -> None:
    """Send one reply frame (the worker's side; blocking)."""
    data = memoryview(_REPLY_HEAD.pack(len(payload), req_id, kind) + payload)
    while data:
        data = data[os.write(fd, data):]


def reply_reader(fd: int) -> FrameReader:
    """The pool's non-blocking reader of a worker's replies: frames ``(req_id, kind, payload)``."""
    return FrameReader(fd, _REPLY_HEAD, blocking=False)


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


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
