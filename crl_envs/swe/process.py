"""Run one command with a deadline, rlimits and bounded, safely decoded output."""

from __future__ import annotations

import functools
import os
import resource
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

_WATCH_EVERY_S = 0.25
_SIGNAL_HINTS = {
    "SIGXCPU": "CPU time limit reached",
    "SIGXFSZ": "file size limit reached",
    "SIGKILL": "killed",
    "SIGSEGV": "segmentation fault (often the memory limit)",
}


@dataclass(frozen=True)
class Limits:
    """Resource limits applied to every command.

    Attributes:
        timeout_s: wall-clock seconds per command.
        cpu_s: CPU seconds per process (``RLIMIT_CPU`` soft limit: SIGXCPU; SIGKILL at ``cpu_s + max(5, cpu_s)``).
        memory_mb: address space per process in MiB (``RLIMIT_AS``).
        file_size_mb: largest file a process may write, MiB (``RLIMIT_FSIZE``).
        nproc: processes of the sandbox uid (``RLIMIT_NPROC``; per uid, so shared by concurrent sandboxes).
        tmp_mb: size of the private ``/tmp`` tmpfs (bwrap).
        output_bytes: bytes of output kept (head and tail) in a command's result.
        disk_mb: how much the workspace's filesystem may fill up during one command, and the most
            the workspace may grow over an episode (the env ends the episode beyond it).
    """

    timeout_s: float = 60.0
    cpu_s: int = 120
    memory_mb: int = 4096
    file_size_mb: int = 256
    nproc: int = 256
    tmp_mb: int = 256
    output_bytes: int = 16384
    disk_mb: int = 2048


@dataclass(frozen=True)
class CommandResult:
    """What one command did."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    output_truncated: bool = False
    duration_s: float = 0.0
    error: str = ""

    def status_line(self, timeout_s: float | None = None) -> str:
        """A one-line summary such as ``[exit code 0]`` or ``[killed: wall-clock timeout ...]``."""
        if self.error:
            return f"[error: {self.error}]"
        if self.timed_out:
            limit = f" of {timeout_s:g} s" if timeout_s else ""
            return f"[killed: wall-clock timeout{limit}; the command and all its processes were stopped]"
        code = self.exit_code
        if code is not None and code < 0:
            code = 128 - code
        if code is not None and code > 128:
            try:
                name = signal.Signals(code - 128).name
            except ValueError:
                name = f"signal {code - 128}"
            return f"[exit code {code}: {name}, {_SIGNAL_HINTS.get(name, 'terminated by a signal')}]"
        return f"[exit code {code}]"


def clean_text(data: bytes) -> str:
    """Decode command output safely: invalid UTF-8 and control characters become U+FFFD."""
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    bad = {c: "\ufffd" for c in range(32) if c not in (9, 10)}
    bad[127] = "\ufffd"
    return text.translate(bad)


class BoundedOutput:
    """Keeps the first and last bytes of a stream and counts the rest."""

    def __init__(self, limit: int):
        self.head_limit = max(1, limit * 3 // 4)
        self.tail_limit = max(1, limit - self.head_limit)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        if not self.truncated:
            return clean_text(bytes(self.head + self.tail))
        dropped = self.total - len(self.head) - len(self.tail)
        return (
            clean_text(bytes(self.head))
            + f"\n[... {dropped:,} bytes of output truncated ({self.total:,} in total) ...]\n"
            + clean_text(bytes(self.tail))
        )


def run_bounded(
    argv: list[str],
    *,
    timeout_s: float,
    output_bytes: int,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    limits: Limits | None = None,
    watch: Callable[[], str] | None = None,
) -> CommandResult:
    """Run ``argv`` in a new session with a deadline, rlimits and bounded output.

    On timeout the whole process group is killed with SIGKILL. ``watch`` is polled a few
    times a second while the command runs; a non-empty answer kills the command and becomes
    its ``error``. Never raises for a failing command; an ``OSError`` starting it is reported
    in ``error``.
    """
    start = time.monotonic()
    preexec = functools.partial(_apply_rlimits, limits) if limits is not None else None
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, cwd=cwd, start_new_session=True, preexec_fn=preexec,
        )
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return CommandResult("", None, error=f"could not start the command: {e}")
    out = BoundedOutput(output_bytes)
    timed_out = False
    stopped = ""
    next_watch = start + _WATCH_EVERY_S
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
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
            if not sel.select(min(remaining, _WATCH_EVERY_S if watch is not None else 1.0)):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            out.feed(chunk)
    while not (timed_out or stopped):
        try:
            proc.wait(timeout=min(_WATCH_EVERY_S, max(0.0, start + timeout_s - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() >= start + timeout_s:
                timed_out = True
            elif watch is not None:
                stopped = watch()
    if timed_out or stopped:
        kill_group(proc)
    proc.stdout.close()
    code = proc.wait()
    return CommandResult(
        out.text(), None if timed_out or stopped else code, timed_out, out.truncated, time.monotonic() - start,
        error=stopped,
    )


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group that ``proc`` leads (bwrap's children die with it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def _apply_rlimits(limits: Limits) -> None:  # runs in the child between fork and exec
    mib = 1024 * 1024
    for res, soft, hard in (
        # SIGXCPU at the soft limit; SIGKILL only at the hard one, which sits far enough above it
        # that a loaded VM's late CPU-accounting step cannot cross both at once (with a 1 s gap
        # CI once saw a plain SIGKILL). The wall-clock timeout still bounds a trapped SIGXCPU.
        (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + max(5, limits.cpu_s)),
        (resource.RLIMIT_AS, limits.memory_mb * mib, limits.memory_mb * mib),
        (resource.RLIMIT_FSIZE, limits.file_size_mb * mib, limits.file_size_mb * mib),
        (resource.RLIMIT_NPROC, limits.nproc, limits.nproc),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        resource.setrlimit(res, (soft, hard))
