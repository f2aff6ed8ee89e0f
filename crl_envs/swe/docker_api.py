"""``docker exec`` through the Docker Engine API on its unix socket, without the docker CLI.

Starting the docker CLI (a large Go binary) for every command cost about 30 ms of the docker
sandbox's per-command latency; this client speaks the three calls an exec needs (create, start
with the output stream, inspect for the exit code) over the engine's socket. It is used where
the engine is local (``DOCKER_HOST`` unset or ``unix://``); elsewhere the sandbox uses the CLI.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from collections.abc import Callable

from crl_envs.swe.process import BoundedOutput, CommandResult

API = "/v1.41"  # Docker 20.10's API version; later engines still serve it
DEFAULT_SOCKET = "/var/run/docker.sock"
_WATCH_EVERY_S = 0.25


class EngineError(RuntimeError):
    """The engine could not be reached, or refused a call; the message says which and why."""


def local_socket() -> str | None:
    """The engine's unix socket path (``DOCKER_HOST`` or the default), or ``None`` for a remote engine."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        return DEFAULT_SOCKET
    if host.startswith("unix://"):
        return host[len("unix://"):]
    return None


class EngineAPI:
    """A minimal HTTP/1.1 client for the engine's unix socket (one connection per call)."""

    def __init__(self, path: str, timeout_s: float = 60.0):
        self.path = path
        self.timeout_s = timeout_s
        self.chunked = False  # whether the last answer's body is chunked

    def _send(self, method: str, url: str, body: dict | None, timeout_s: float) -> tuple[socket.socket, int, bytes]:
        """Send a request; returns the socket, the status and the bytes read past the headers."""
        data = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {API}{url} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(self.path)
            sock.sendall(head + data)
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    raise EngineError(f"the Docker engine at unix://{self.path} closed the connection")
                buf += chunk
        except (FileNotFoundError, ConnectionRefusedError) as e:
            sock.close()
            raise EngineError(f"cannot connect to the Docker daemon at unix://{self.path} ({e.strerror})") from e
        except TimeoutError as e:
            sock.close()
            raise EngineError(f"the Docker engine at unix://{self.path} did not answer within {timeout_s:g} s") from e
        except OSError as e:
            sock.close()
            raise EngineError(f"the Docker engine at unix://{self.path} failed: {e}") from e
        header, _, rest = buf.partition(b"\r\n\r\n")
        self.chunked = b"transfer-encoding: chunked" in header.lower()  # large JSON answers come chunked
        return sock, int(header.split(b" ", 2)[1]), rest

    def call(self, method: str, url: str, body: dict | None = None) -> tuple[int, dict]:
        """A JSON call; returns ``(status, decoded body)``."""
        sock, status, rest = self._send(method, url, body, self.timeout_s)
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                rest += chunk
        except OSError as e:
            raise EngineError(f"the Docker engine at unix://{self.path} failed mid-answer: {e}") from e
        finally:
            sock.close()
        text = _dechunk(rest) if self.chunked else rest
        try:
            return status, (json.loads(text) if text.strip() else {})
        except json.JSONDecodeError:
            return status, {"message": text.decode(errors="replace")[:500]}

    def exec(self, container: str, cmd: list[str], *, user: str, workdir: str, env: dict[str, str],
             timeout_s: float, output_bytes: int, watch: Callable[[], str] | None = None) -> tuple[CommandResult, str]:
        """Run ``cmd`` in ``container``; returns the result and the exec id (to find its processes).

        Raises:
            EngineError: the engine is unreachable or refused the exec (e.g. no such container).
        """
        start = time.monotonic()
        status, created = self.call("POST", f"/containers/{container}/exec", {
            "Cmd": cmd, "User": user, "WorkingDir": workdir, "Env": [f"{k}={v}" for k, v in env.items()],
            "AttachStdout": True, "AttachStderr": True, "AttachStdin": False, "Tty": False})
        if status != 201:
            raise EngineError(f"the Docker engine refused the exec ({status}): {created.get('message', created)}")
        exec_id = created["Id"]
        sock, status, rest = self._send("POST", f"/exec/{exec_id}/start", {"Detach": False, "Tty": False},
                                        max(1.0, timeout_s))
        out = BoundedOutput(output_bytes)
        timed_out, stopped = False, ""
        frames = _Frames(out)
        frames.feed(rest)
        next_watch = start + _WATCH_EVERY_S
        try:
            if status not in (101, 200):
                raise EngineError(f"the Docker engine refused to start the exec ({status}): {rest[:300]!r}")
            while True:
                now = time.monotonic()
                if watch is not None and now >= next_watch:
                    next_watch = now + _WATCH_EVERY_S
                    stopped = watch()
                    if stopped:
                        break
                remaining = start + timeout_s - now
                if remaining <= 0:
                    timed_out = True
                    break
                sock.settimeout(min(remaining, _WATCH_EVERY_S if watch is not None else 1.0))
                try:
                    chunk = sock.recv(1 << 16)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                frames.feed(chunk)
        except OSError as e:
            raise EngineError(f"the Docker engine at unix://{self.path} failed during the command: {e}") from e
        finally:
            sock.close()
        code = None
        if not (timed_out or stopped):
            code = self._exit_code(exec_id)
        return CommandResult(out.text(), code, timed_out, out.truncated, time.monotonic() - start, error=stopped), exec_id

    def _exit_code(self, exec_id: str) -> int | None:
        for delay in (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5):  # the stream can end a moment before the exec
            time.sleep(delay)
            status, info = self.call("GET", f"/exec/{exec_id}/json")
            if status != 200:
                raise EngineError(f"the Docker engine lost the exec ({status}): {info.get('message', info)}")
            if not info.get("Running"):
                return info.get("ExitCode")
        return None


class _Frames:
    """Demultiplexes the engine's stdout/stderr stream (8-byte headers) into one bounded output."""

    def __init__(self, out: BoundedOutput):
        self.out = out
        self.buf = b""

    def feed(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 8:
            size = struct.unpack(">I", self.buf[4:8])[0]
            if len(self.buf) < 8 + size:
                return
            self.out.feed(self.buf[8:8 + size])
            self.buf = self.buf[8 + size:]


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2:]
    return out
