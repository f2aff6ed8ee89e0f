"""The ``docker`` sandbox: one container per episode, one ``docker exec`` per command.

The container comes from the instance's image (see :mod:`crl_envs.swe.images`: an official
SWE-bench harness image already in the engine, or one built locally; never pulled). It is
contained as the ``bwrap`` sandbox is, with the same :class:`~crl_envs.swe.sandbox.Limits`:

* no network (``--network none``), a read-only root, a private ``/tmp`` tmpfs, the repository
  in ``/testbed`` on a volume of its own (copied from the image, removed with the container);
* commands run as a private unused uid (per sandbox, so ``RLIMIT_NPROC`` is per sandbox) with no
  capabilities and ``no-new-privileges``, under the same rlimits as bwrap (CPU, address space,
  file size, processes, no core files), and every process the command leaves behind is killed when
  it ends; a wall-clock timeout and the disk quota as for bwrap;
* each command is one exec, sent straight to the engine's API on its unix socket where the engine
  is local (:mod:`crl_envs.swe.docker_api`), else with ``docker exec``;
* container-wide caps: memory (``--memory`` = ``--memory-swap``) and ``--pids-limit``.

Containers carry the label ``crl-bench.swe.sandbox`` and their owner process; the first sandbox a
process opens removes the containers of owners that are gone (a crashed run). A Docker engine
that stops answering, or a container that dies, makes the command raise
:class:`~crl_envs.swe.sandbox.SandboxFailure` naming the cause.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

from crl_envs.swe.docker_api import EngineAPI, EngineError, local_socket
from crl_envs.swe.instances import SWEInstance
from crl_envs.swe.sandbox import (
    PRIVATE_UID_RANGE,
    CommandResult,
    Limits,
    Sandbox,
    SandboxFailure,
    SandboxUnavailable,
    chown_tree,
    run_bounded,
    sandbox_env,
)

TESTBED = "/testbed"
LABEL = "crl-bench.swe.sandbox"
OWNER_LABEL = "crl-bench.swe.owner"
ENGINE_TIMEOUT_S = 60.0  # any single engine call (run, inspect, rm) that takes longer is an engine failure
# The harness images install the repository's environment as the conda env "testbed".
_ACTIVATE = "[ -f /opt/miniconda3/bin/activate ] && . /opt/miniconda3/bin/activate testbed >/dev/null 2>&1\n"
# Runs as the sandbox uid: the command under bwrap's rlimits (set with bash's ulimit, which needs
# nothing in the image), then every process of that uid it left behind is killed (``kill -1``
# spares the caller), as bwrap's PID namespace does, and /tmp is emptied, as bwrap's private /tmp
# is. The wrapper's own stderr is dropped, so that a command killed by a signal is reported only
# by its status line, as with bwrap (not also by the wrapper shell).
_WRAPPER = ('exec 3>&2 2>/dev/null; (ulimit -t {cpu_hard} && ulimit -S -t {cpu} && ulimit -v {as_kb} -f {fsize_kb} '
            '-u {nproc} -c 0 && exec bash -c "$1") 2>&3 3>&-; rc=$?; kill -9 -1; shopt -s dotglob nullglob; '
            't=(/tmp/*); [ ${{#t[@]}} -eq 0 ] || rm -rf "${{t[@]}}"; exit $rc')
# Exit codes the docker CLI itself uses (or a dead container gives); only then is the engine asked
# whether the command or the sandbox failed, so ordinary failing commands cost nothing extra.
_ENGINE_CODES = {125, 126, 127, 137}
_ENGINE_WORDS = ("docker daemon", "error response from daemon", "no such container", "is not running")


@functools.lru_cache(maxsize=1)
def docker_available() -> str:
    """An empty string when a Docker engine answers, else the reason it does not."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        proc = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                              text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`docker info` failed: {e}"
    if proc.returncode != 0:
        return f"no Docker engine answers `docker info`: {(proc.stderr or proc.stdout).strip()[:300]}"
    return ""


def instance_image(inst: SWEInstance, namespace: str = "swebench") -> str:
    """The published harness image name of ``inst``: its ``image`` field, else SWE-bench's naming."""
    from crl_envs.swe.images import official_image_name

    return inst.image or official_image_name(inst, namespace)


def _engine(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    """A docker CLI call whose failure to answer in time is a :class:`SandboxFailure`."""
    timeout = min(timeout or ENGINE_TIMEOUT_S, ENGINE_TIMEOUT_S)
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise SandboxFailure(f"the Docker engine did not answer `docker {args[0]}` within {timeout:g} s "
                             "(is it hung, or is its disk full?)") from e
    except OSError as e:
        raise SandboxFailure(f"the docker CLI could not run: {e}") from e


def _process_start(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _owner() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_process_start(pid)}"


def reap_leftovers() -> list[str]:
    """Remove sandbox containers (and their volumes) whose owner process on this host is gone."""
    proc = _engine("ps", "-a", "--filter", f"label={LABEL}", "--format", f'{{{{.ID}}}} {{{{.Label "{OWNER_LABEL}"}}}}')
    host = socket.gethostname()
    dead = []
    for line in proc.stdout.split("\n"):
        cid, _, owner = line.partition(" ")
        parts = owner.split(":")
        if not cid or len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        if _process_start(int(parts[1])) != parts[2]:  # gone, or the pid now belongs to another process
            dead.append(cid)
    if dead:
        _engine("rm", "-f", "-v", *dead)
    return dead


@functools.lru_cache(maxsize=1)
def _reap_once() -> None:
    reap_leftovers()


class DockerSandbox(Sandbox):
    """One container per episode from an instance's image; commands run with ``docker exec``.

    Args:
        source: the instance (its image is resolved by :func:`crl_envs.swe.images.resolve_image`) or
            an image name.
        limits: per-command limits, as for bwrap; memory and processes are also container-wide caps.
        mounts: host directories mounted read-only, ``{host_path: container_path}``.
        workspace: a host directory bound at ``/testbed`` instead of the image's own ``/testbed``.

    Raises:
        SandboxUnavailable: no engine answers, or the image is missing (:class:`ImageMissing`).
        SandboxFailure: the engine failed to start the container.
    """

    kind = "docker"
    workdir = TESTBED

    def __init__(self, source: SWEInstance | str, limits: Limits | None = None, mounts: dict[str, str] | None = None,
                 *, workspace: str | Path | None = None):
        reason = docker_available()
        if reason:
            raise SandboxUnavailable(f"sandbox='docker' needs a running Docker engine: {reason}. Use "
                                     "sandbox='bwrap' (apt-get install bubblewrap) instead.")
        from crl_envs.swe.images import ImageMissing, image_labels, resolve_image

        super().__init__(Path(workspace) if workspace is not None else Path("/nonexistent"), limits, mounts)
        self.closed = True  # until the container runs
        _reap_once()
        if isinstance(source, SWEInstance):
            self.image = resolve_image(source)
        else:
            self.image = source
            if image_labels(source) is None:
                raise ImageMissing(f"the Docker image {source} is not in the engine (images are never pulled)")
        self.uid = secrets.SystemRandom().randrange(*PRIVATE_UID_RANGE)
        self.container = f"crl-swe-{uuid.uuid4().hex[:12]}"
        self.local_workspace = workspace is not None
        self.volume = ""  # the anonymous volume holding /testbed
        lim = self.limits
        argv = ["run", "-d", "--init", "--pull=never", "--name", self.container, "--label", f"{LABEL}=1",
                "--label", f"{OWNER_LABEL}={_owner()}", "--network", "none", "--hostname", "sandbox",
                "--memory", f"{lim.memory_mb}m", "--memory-swap", f"{lim.memory_mb}m", "--pids-limit", str(lim.nproc),
                "--cap-drop", "ALL", "--cap-add", "CHOWN", "--security-opt", "no-new-privileges", "--read-only",
                "--tmpfs", f"/tmp:rw,nosuid,nodev,size={lim.tmp_mb}m,mode=1777", "--ulimit", "core=0", "-w", TESTBED]
        if workspace is not None:
            chown_tree(self.workspace, self.uid)
            argv += ["-v", f"{self.workspace}:{TESTBED}"]
        else:
            argv += ["-v", TESTBED]  # an anonymous volume, filled from the image's /testbed
        for host, inside in self.mounts.items():
            os.chmod(host, os.stat(host).st_mode | 0o555)  # readable by the private uid
            argv += ["-v", f"{host}:{inside}:ro"]
        argv += [self.image, "sleep", "infinity"]
        proc = _engine(*argv)
        if proc.returncode != 0:
            _engine("rm", "-f", "-v", self.container)
            raise SandboxFailure(f"could not start a container from {self.image}: {proc.stderr.strip()[:500]}")
        self.closed = False
        try:
            self._prepare()
        except BaseException:
            self.close()
            raise

    def _api(self) -> EngineAPI | None:
        """The engine's API on its local socket (``None`` for a remote engine: the CLI is used)."""
        path = local_socket()
        return EngineAPI(path, ENGINE_TIMEOUT_S) if path is not None else None

    def _state(self) -> dict:
        """The container's ``docker inspect`` data; :class:`SandboxFailure` when the engine cannot say."""
        api = self._api()
        if api is not None:
            try:
                status, info = api.call("GET", f"/containers/{self.container}/json")
            except EngineError as e:
                raise SandboxFailure(f"the Docker engine failed during the command: {e}") from e
            if status != 200:
                raise SandboxFailure(f"the sandbox container {self.container} is gone: {info.get('message', info)}")
            return info
        proc = _engine("inspect", "--format", "{{json .}}", self.container, timeout=30)
        if proc.returncode != 0:
            raise SandboxFailure(f"the Docker engine failed during the command: {proc.stderr.strip()[:300]}")
        return json.loads(proc.stdout)

    def _exec_root(self, argv: list[str], user: str = "0") -> CommandResult:
        """A trusted command in the container (not limited like the agent's), by API or CLI."""
        api = self._api()
        if api is not None:
            try:
                return api.exec(self.container, argv, user=user, workdir="/", env={}, timeout_s=ENGINE_TIMEOUT_S,
                                output_bytes=4096)[0]
            except EngineError as e:
                raise SandboxFailure(f"the Docker engine failed: {e}") from e
        proc = _engine("exec", "-u", user, self.container, *argv)
        return CommandResult(proc.stdout + proc.stderr, proc.returncode)

    def _prepare(self) -> None:
        """Give /testbed to the sandbox uid and find its volume on this host (for the disk quota)."""
        if not self.local_workspace:
            chown = self._exec_root(["chown", "-R", f"{self.uid}:{self.uid}", TESTBED])
            if chown.exit_code != 0:
                raise SandboxFailure(f"could not prepare {TESTBED} in {self.image}: {chown.output.strip()[:300]}")
            for m in self._state().get("Mounts") or []:
                if m.get("Destination") == TESTBED and m.get("Name"):
                    self.volume = m["Name"]  # removed in close() even if the container was removed without it
                if m.get("Destination") == TESTBED and m.get("Source") and os.path.isdir(m["Source"]):
                    self.workspace = Path(m["Source"])  # a local engine: the quota watch reads it
                    self.local_workspace = True

    def _cmd(self, command: str) -> list[str]:
        """The wrapper that runs ``command`` under the limits, as the exec's argv."""
        lim = self.limits
        wrapper = _WRAPPER.format(cpu=lim.cpu_s, cpu_hard=lim.cpu_s + max(5, lim.cpu_s), as_kb=lim.memory_mb * 1024,
                                  fsize_kb=lim.file_size_mb * 1024, nproc=lim.nproc)
        return ["bash", "-c", wrapper, "crl-sandbox", _ACTIVATE + command]

    @staticmethod
    def _env() -> dict[str, str]:
        env = sandbox_env([], "/tmp")
        env.pop("PATH")  # the image's PATH (its venv or conda env) is kept
        return env

    def _run(self, command: str, timeout_s: float, output_bytes: int) -> CommandResult:
        watch = self.disk_watch() if self.local_workspace else None
        api = self._api()
        if api is not None:  # a local engine: straight to its API (no CLI start per command)
            try:
                res, _ = api.exec(
                    self.container, self._cmd(command), user=f"{self.uid}:{self.uid}", workdir=TESTBED,
                    env=self._env(), timeout_s=timeout_s, output_bytes=output_bytes, watch=watch)
            except EngineError as e:
                raise SandboxFailure(f"the Docker engine failed during the command: {e}") from e
        else:
            argv = ["docker", "exec", "-u", f"{self.uid}:{self.uid}", "-w", TESTBED]
            for k, v in self._env().items():
                argv += ["-e", f"{k}={v}"]
            res = run_bounded([*argv, self.container, *self._cmd(command)], timeout_s=timeout_s,
                              output_bytes=output_bytes, watch=watch)
        if res.timed_out or res.error:  # the exec's client is gone; stop what it started inside
            self._kill_all()
        if res.exit_code in _ENGINE_CODES or res.exit_code is None or (
                res.exit_code == 1 and any(w in res.output[-2000:].lower() for w in _ENGINE_WORDS)):
            self._check_alive(res)
        return res

    def _kill_all(self) -> None:
        try:
            self._exec_root(["kill", "-9", "-1"], user=f"{self.uid}:{self.uid}")
        except SandboxFailure:
            pass  # _check_alive names the cause

    def _check_alive(self, res: CommandResult) -> None:
        """Raise :class:`SandboxFailure` when the engine or the container, not the command, failed."""
        state = self._state().get("State") or {}
        if state.get("Status") != "running":
            why = " (killed for memory)" if state.get("OOMKilled") else ""
            raise SandboxFailure(f"the sandbox container {self.container} is {state.get('Status')}{why}, not running "
                                 f"(command output: {res.output.strip()[-300:]!r})")

    def workspace_bytes(self) -> int:
        return super().workspace_bytes() if self.local_workspace else 0

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            api = self._api()
            try:  # an engine that is gone leaves the container to the next run's reap_leftovers
                if api is not None:
                    api.call("DELETE", f"/containers/{self.container}?force=1&v=1")
                    if self.volume:
                        api.call("DELETE", f"/volumes/{self.volume}?force=1")
                else:
                    _engine("rm", "-f", "-v", self.container)
                    if self.volume:
                        _engine("volume", "rm", "-f", self.volume)
            except (SandboxFailure, EngineError):
                pass
        super().close()
