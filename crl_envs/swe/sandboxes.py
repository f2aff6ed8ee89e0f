"""Which sandbox runs a SWE workspace: ``bwrap`` (the default), ``docker`` or ``local``.

The factory lives apart from :mod:`crl_envs.swe.sandbox` (the base class and the bwrap and local
sandboxes) because :mod:`crl_envs.swe.docker_sandbox` builds on that base class.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from crl_envs.swe.sandbox import BwrapSandbox, Limits, LocalSandbox, Sandbox, SandboxUnavailable


def make_sandbox(kind: str, workspace: str | Path, limits: Limits | None = None,
                 mounts: dict[str, str] | None = None, python: str | None = None) -> Sandbox:
    """Build a sandbox over a host workspace directory (``docker``: bound into the base image)."""
    if kind == "docker":
        from crl_envs.swe.docker_sandbox import DockerSandbox
        from crl_envs.swe.images import BASE_IMAGE

        return DockerSandbox(BASE_IMAGE, limits, mounts, workspace=workspace)
    if kind == "bwrap":
        return BwrapSandbox(workspace, limits, mounts, python)
    if kind == "local":
        return LocalSandbox(workspace, limits, mounts, python)
    raise ValueError(f"unknown sandbox {kind!r}; use 'bwrap', 'docker' or 'local'")


def default_sandbox_kind() -> str:
    """``bwrap`` where bubblewrap is installed; otherwise an error that names the fix."""
    if shutil.which("bwrap"):
        return "bwrap"
    raise SandboxUnavailable(
        "No sandbox for SWE envs: install bubblewrap (apt-get install bubblewrap), or pass sandbox='docker' "
        "where a Docker engine runs, or opt in to sandbox='local' (no isolation)."
    )
