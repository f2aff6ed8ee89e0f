"""A direct socket between the Ray pool and each of its actors, so env calls skip Ray's round trip.

A Ray actor call costs about a millisecond here (0.8-1 ms on 2 cores, driver and actor on one
machine), far more than a cheap env step; a plain TCP round trip between the same two processes
costs about 50 us. So once an actor is up, the pool opens a socket to it and sends its batches of
calls there; Ray still places, kills and re-creates the actors. The actor listens on its node's
address (the one Ray reports) on a port the OS picks, and serves one client, which must first
prove it holds the pool's secret (an HMAC of a random challenge; the secret reaches the actor as
a Ray call argument, so the channel is as trusted as the cluster's own traffic). Where the pool
cannot connect (a firewall between nodes), it keeps sending that actor Ray calls.

Frames are an 8-byte big-endian length, then a pickle. A request is ``(batch id, [pickled call, ...])``
and its reply ``(batch id, [answer, ...])``, each answer as :func:`crl_envs.pool.host.answer` gives it.
The actor serves requests one after the other, in order. When the connection drops (the actor's
process died, or its node went away) every request waiting on it fails with :class:`ChannelLost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import pickle
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

_LEN = struct.Struct("!Q")
_NONCE_BYTES = 32
_OK = b"k"


class ChannelLost(ConnectionError):
    """The socket to an actor closed or broke: the calls waiting on it cannot be answered."""


def new_secret() -> bytes:
    """A fresh secret for one pool's channels."""
    return os.urandom(32)


def _digest(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, nonce, hashlib.sha256).digest()


# ---------------------------------------------------------------------------- actor side (blocking threads)
def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("the pool closed the channel")
        buf += chunk
    return bytes(buf)


class ChannelServer:
    """Listens on ``host`` for the pool and serves its batches with ``serve`` in a thread of the actor.

    Args:
        serve: answers one batch: pickled calls in, a list of answers out (same order).
        secret: what the connecting pool must prove it holds.
        host: the address to listen on (the actor's node address).
    """

    def __init__(self, serve: Callable[[list[bytes]], list[Any]], secret: bytes, host: str):
        self._serve, self._secret = serve, secret
        self._sock = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.address: tuple[str, int] = (host, self._sock.getsockname()[1])
        self._claimed = threading.Lock()
        threading.Thread(target=self._accept, name="pool-channel-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed: the pool has connected
                return
            # a stranger that connects and stays silent must not block the pool's own connection
            threading.Thread(target=self._session, args=(conn,), name="pool-channel", daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(30.0)
                nonce = os.urandom(_NONCE_BYTES)
                conn.sendall(nonce)
                if not hmac.compare_digest(_recv_exact(conn, 32), _digest(self._secret, nonce)):
                    return
                if not self._claimed.acquire(blocking=False):
                    return  # the pool is already connected
                conn.sendall(_OK)
                conn.settimeout(None)
            except (OSError, EOFError):
                return
            self._sock.close()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                try:
                    (n,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
                    batch_id, calls = pickle.loads(_recv_exact(conn, n))  # noqa: S301 - from the authenticated pool
                    data = pickle.dumps((batch_id, self._serve(calls)), protocol=pickle.HIGHEST_PROTOCOL)
                    conn.sendall(_LEN.pack(len(data)) + data)
                except (OSError, EOFError):
                    return


# ---------------------------------------------------------------------------- pool side (the event loop)
class Channel:
    """The pool's end of one actor's socket: :meth:`request` sends a batch and returns a future of its answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.loop = asyncio.get_running_loop()
        self._reader, self._writer = reader, writer
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._lost: str | None = None
        self._task = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, address: tuple[str, int], secret: bytes, timeout: float) -> Channel:
        """Connect to an actor's :class:`ChannelServer` and prove the secret.

        Raises:
            OSError, asyncio.TimeoutError, ChannelLost: the channel cannot be opened (the caller falls back to Ray).
        """
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), timeout)
        try:
            nonce = await asyncio.wait_for(reader.readexactly(_NONCE_BYTES), timeout)
            writer.write(_digest(secret, nonce))
            if await asyncio.wait_for(reader.readexactly(1), timeout) != _OK:
                raise ChannelLost("the actor refused the channel")
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            writer.close()
            raise ChannelLost(f"the actor closed the channel while it opened: {e}") from None
        except BaseException:
            writer.close()
            raise
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    def request(self, calls: list[bytes]) -> asyncio.Future:
        """Send one batch (pickled calls); the future gets the list of answers, or :class:`ChannelLost`."""
        done = self.loop.create_future()
        if self._lost is not None:
            done.set_exception(ChannelLost(self._lost))
            return done
        batch_id, self._next_id = self._next_id, self._next_id + 1
        data = pickle.dumps((batch_id, calls), protocol=pickle.HIGHEST_PROTOCOL)
        self._pending[batch_id] = done
        self._writer.write(_LEN.pack(len(data)) + data)  # buffered: never blocks the loop, even on a hung actor
        return done

    async def _read(self) -> None:
        try:
            while True:
                (n,) = _LEN.unpack(await self._reader.readexactly(_LEN.size))
                batch_id, answers = pickle.loads(await self._reader.readexactly(n))  # noqa: S301 - our actor's reply
                done = self._pending.pop(batch_id, None)
                if done is not None and not done.done():
                    done.set_result(answers)
        except asyncio.CancelledError:
            self._fail_all("the channel was closed")
            raise
        except Exception as e:  # noqa: BLE001 - closed, reset, or a frame that cannot be read: the actor is gone
            self._fail_all(f"the connection to the actor closed ({type(e).__name__})")
            with contextlib.suppress(Exception):
                self._writer.close()

    def _fail_all(self, why: str) -> None:
        self._lost = why
        pending, self._pending = self._pending, {}
        for done in pending.values():
            if not done.done():
                done.set_exception(ChannelLost(why))

    def close(self) -> None:
        """Close the socket; requests still waiting fail with :class:`ChannelLost`."""
        if self._lost is None:
            self._fail_all("the channel was closed")
        with contextlib.suppress(Exception):
            self._writer.close()
        if not self.loop.is_closed():
            self._task.cancel()
