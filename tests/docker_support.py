"""A Docker engine and the SWE images for tests marked ``docker``.

``docker_engine`` (session): uses the engine that answers ``docker info``; where none does and we
are root with ``dockerd`` installed (``make setup`` installs docker.io), it starts one in the
background and stops it after the last test session using it (pytest-xdist workers share it;
the last one out stops it). Stopping dockerd leaves the ``docker0`` bridge and its iptables rules
behind; that is harmless and the next start reuses them. Where no engine can run, the tests skip
with the reason.

``docker_images`` (session): builds the base, env and instance images of ``crl/SWE-Mini-v0`` once
(kept in the engine between sessions; a rebuild happens only when the bundled set changes).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

STATE = Path(os.environ.get("CRL_DOCKERD_STATE", "/tmp/crl-bench-dockerd"))
START_TIMEOUT_S = 60


@contextlib.contextmanager
def _locked():
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _answers() -> str:
    """An empty string when ``docker info`` answers, else why not."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed (apt-get install docker.io, or make setup as root)"
    try:
        proc = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                              timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 20 s"
    return "" if proc.returncode == 0 else (proc.stderr or proc.stdout).strip()[:300]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, e.g. a dockerd another xdist worker started and we stopped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _start_dockerd() -> str:
    """Start dockerd in the background (under the lock); an empty string on success, else why not."""
    if shutil.which("dockerd") is None:
        return "no Docker engine answers and dockerd is not installed (apt-get install docker.io)"
    if os.geteuid() != 0:
        return "no Docker engine answers and starting dockerd needs root"
    log = open(STATE / "dockerd.log", "ab")  # noqa: SIM115 - kept open by the daemon
    proc = subprocess.Popen(["dockerd"], stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    (STATE / "started.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if not _answers():
            return ""
        time.sleep(0.5)
    tail = (STATE / "dockerd.log").read_text(errors="replace")[-800:]
    _stop(proc.pid)
    return f"dockerd did not come up within {START_TIMEOUT_S} s: {tail}"


def _stop(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                break
        time.sleep(0.2)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    (STATE / "started.pid").unlink(missing_ok=True)


def _users() -> Path:
    d = STATE / "users"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def docker_engine():
    """A Docker engine that answers; started here (and stopped later) when none does."""
    with _locked():
        reason = _answers()
        if reason:
            reason = _start_dockerd()
        if reason:
            pytest.skip(f"no Docker engine: {reason}")
        (_users() / str(os.getpid())).touch()
    from crl_envs.swe.docker_sandbox import docker_available

    docker_available.cache_clear()
    yield
    with _locked():
        (_users() / str(os.getpid())).unlink(missing_ok=True)
        live = [p for p in _users().iterdir() if p.name.isdigit() and alive(int(p.name))]
        started = STATE / "started.pid"
        if not live and started.is_file():  # the last session out stops the dockerd a session started
            _stop(int(started.read_text()))


@pytest.fixture(scope="session")
def docker_images(docker_engine):
    """Every crl/SWE-Mini-v0 instance image (and the base image), built once and kept in the engine."""
    pytest.importorskip("swebench")
    from crl_envs.swe.bundled import bundled_instances, bundled_repos_dir
    from crl_envs.swe.images import ImageBuildError, build_images

    with _locked():  # xdist workers would otherwise build the same images twice
        try:
            return build_images(bundled_instances(), bundled_repos_dir(), log=lambda _msg: None)
        except ImageBuildError as e:
            pytest.skip(f"the SWE images could not be built here: {e}")
