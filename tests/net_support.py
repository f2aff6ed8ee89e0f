"""Loopback helpers shared by the tests that start servers or distributed workers."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on now (the OS picked it; closed again before it is returned)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
