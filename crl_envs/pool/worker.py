"""The worker process: hosts several envs and answers requests over a pipe.

Requests arrive framed on their own pipe (:class:`crl_envs.pool.pipes.RequestReader`) as
``(req_id, slot, method, args, kwargs)`` tuples (``None`` asks the worker to exit), and are served in
order (so the pool knows a queued call starts when the reply ahead of it arrives). Each is
answered by a reply frame (:func:`crl_envs.pool.pipes.write_reply`): ``OK`` with the pickled
result, or ``ERROR`` with ``(type, message, traceback)``. An ``EXIT`` frame with the reason
announces that the worker recycles itself (memory limit).
A worker exits by itself when the pool's process dies, even in the middle of a hung call.

Only plain text and small Python objects cross the pipe; there is no shared memory. The
envs themselves live in an :class:`~crl_envs.pool.host.EnvHost`, which applies the checks
every backend shares (e.g. a text env must return ``str`` observations).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from multiprocessing.connection import Connection

from crl_envs.pool.host import EnvHost, answer
from crl_envs.pool.pipes import ERROR, EXIT, OK, RequestReader, dumps, write_reply

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    """This process's resident memory in MiB (read from ``/proc``; 0 where that is unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return 0.0


def _exit_with_parent(interval: float = 0.5) -> None:
    """Exit as soon as the pool's process dies, even while an env call hangs (no orphans after ``kill -9``)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="crl-env-parent-watch", daemon=True).start()


def worker_main(requests: Connection, conn: Connection, max_rss_mb: float | None = None) -> None:
    """Serve requests until the parent closes the pipe or sends ``None``.

    Args:
        requests: the pipe requests arrive on.
        conn: the pipe replies go to.
        max_rss_mb: when set, the worker exits (announcing why) after a request that leaves
            its resident memory above this many MiB, so a leaking env cannot exhaust the machine.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _exit_with_parent()
    import crl_envs  # noqa: F401 - registers ids and plugins in this process

    host = EnvHost()
    reader, out = RequestReader(requests), conn.fileno()
    try:
        while True:
            try:
                msg = reader.next()
            except (EOFError, OSError):
                break
            if msg is None:
                break
            req_id, slot, method, args, kwargs = msg
            ok, payload = answer(host, slot, method, args, kwargs)
            try:
                write_reply(out, req_id, OK if ok else ERROR, payload)
            except OSError:
                break
            if max_rss_mb is not None and (rss := rss_mb()) > max_rss_mb:
                write_reply(out, -1, EXIT, dumps(f"worker memory {rss:.0f} MiB passed max_worker_rss_mb="
                                                 f"{max_rss_mb:g} after {method} on slot {slot} (does an env leak "
                                                 "memory?)"))
                break
    finally:
        host.close()
        conn.close()
        requests.close()
        os._exit(0)
