"""The ``docker`` sandbox: an instance's SWE-bench harness image, where a Docker engine runs.

The harness images (``swebench/sweb.eval.x86_64.<id>``, built by ``swebench`` or pulled from
Docker Hub) hold the repository at ``/testbed`` at ``base_commit`` with its environment
installed. Each episode gets its own container (no network, memory, pid and ulimit caps);
every command is one ``docker exec`` with a wall-clock timeout; the container is removed at
the end of the episode.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import uuid
from pathlib import Path

from crl_envs.swe.instances import SWEInstance
from crl_envs.swe.sandbox import CommandResult, Limits, Sandbox, SandboxUnavailable, run_bounded

TESTBED = "/testbed"
# The harness images install the repository's environment as the conda env "testbed".
_ACTIVATE = "[ -f /opt/miniconda3/bin/activate ] && . /opt/miniconda3/bin/activate testbed >/dev/null 2>&1\n"


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
    """The harness image of ``inst``: its ``image`` field, else SWE-bench's naming scheme."""
    if inst.image:
        return inst.image
    key = inst.instance_id.replace("__", "_1776_").lower()
    return f"{namespace}/sweb.eval.x86_64.{key}:latest"


class DockerSandbox(Sandbox):
    """One container per episode from the instance's harness image.

    Args:
        inst: the instance (its image is used).
        limits: per-command limits; memory and processes are also container-wide caps.
        mounts: host directories mounted read-only, ``{host_path: container_path}``.
    """

    kind = "docker"
    workdir = TESTBED

    def __init__(self, inst: SWEInstance, limits: Limits | None = None, mounts: dict[str, str] | None = None):
        reason = docker_available()
        if reason:
            raise SandboxUnavailable(f"sandbox='docker' needs a running Docker engine: {reason}. Use "
                                     "sandbox='bwrap' (apt-get install bubblewrap) instead.")
        super().__init__(Path("/nonexistent"), limits, mounts)
        self.image = instance_image(inst)
        self.container = f"crl-swe-{uuid.uuid4().hex[:12]}"
        lim = self.limits
        argv = ["docker", "run", "-d", "--rm", "--name", self.container, "--network", "none",
                "--memory", f"{lim.memory_mb}m", "--pids-limit", str(lim.nproc), "--cpus", "1",
                "--ulimit", f"fsize={lim.file_size_mb * 1024 * 1024}", "--ulimit", f"cpu={lim.cpu_s}",
                "--tmpfs", f"/tmp:size={lim.tmp_mb}m", "-w", TESTBED]
        for host, inside in self.mounts.items():
            argv += ["-v", f"{host}:{inside}:ro"]
        argv += [self.image, "sleep", "infinity"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise SandboxUnavailable(f"could not start {self.image}: {proc.stderr.strip()[:500]} (build or pull the "
                                     "SWE-bench harness image first, e.g. with swebench.harness.prepare_images)")

    def _run(self, command: str, timeout_s: float, output_bytes: int) -> CommandResult:
        res = run_bounded(["docker", "exec", "-w", TESTBED, self.container, "bash", "-c", _ACTIVATE + command],
                          timeout_s=timeout_s, output_bytes=output_bytes)
        if res.timed_out:  # the exec client is dead; stop what it started inside the container
            subprocess.run(["docker", "exec", self.container, "kill", "-9", "-1"], capture_output=True,
                           timeout=30, check=False)
        return res

    def close(self) -> None:
        if not self.closed:
            subprocess.run(["docker", "rm", "-f", self.container], capture_output=True, timeout=60, check=False)
        super().close()
