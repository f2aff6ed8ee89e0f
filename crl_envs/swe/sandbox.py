"""Sandboxes that run an agent's shell commands: ``bwrap`` (default), ``docker`` and ``local``.

Every backend runs one subprocess per command with a wall-clock timeout, rlimits on CPU
seconds, address space, file size and processes, and output truncated with a marker.

* ``bwrap`` (bubblewrap, ``apt-get install bubblewrap``): a fresh, read-only root built from
  the host's ``/usr``, ``/etc`` (minus ``shadow``, ``ssh`` keys and the like) and the Python
  prefixes (nothing else of the host: no ``$HOME``, no project checkout), a private tmpfs ``/tmp``, the workspace bound read-write at
  ``/workspace``, no network (``--unshare-net``), its own PID namespace (every process of a
  command dies with it: ``--unshare-pid``, ``--die-with-parent``) and, when we are root, a real
  drop to a private unused uid/gid per sandbox (``setpriv``) after the mounts are made; otherwise
  a user namespace maps the caller to uid 65534.
* ``docker``: one container per episode from the instance's image, with the same limits (see
  :mod:`crl_envs.swe.docker_sandbox`; images are built by :mod:`crl_envs.swe.images`).
* ``local``: rlimits and a process group only. No isolation at all; opt-in, with a loud warning.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from crl_envs.swe.process import CommandResult, Limits, clean_text, kill_group, run_bounded

__all__ = ["CommandResult", "Limits", "Sandbox", "SandboxFailure", "SandboxUnavailable", "clean_text", "kill_group", "run_bounded"]

SANDBOX_UID = 65534  # the uid commands see in user-namespace mode
# As root, each sandbox drops to its own unused uid from this range, so per-uid limits
# (RLIMIT_NPROC) are per sandbox: a fork bomb in one episode cannot starve another.
PRIVATE_UID_RANGE = (3_000_000, 4_000_000)
WORKDIR = "/workspace"
_HIDDEN_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/machine-id")
_HIDDEN_DIRS = ("/etc/ssh", "/etc/ssl/private", "/etc/sudoers.d")


class SandboxUnavailable(RuntimeError):
    """The requested sandbox backend cannot run here; the message names the fix."""


class SandboxFailure(RuntimeError):
    """The sandbox itself failed (e.g. its Docker engine stopped answering), not the agent's command."""


def sandbox_env(path_dirs: list[str], home: str) -> dict[str, str]:
    """The only environment variables a command sees (no host secrets leak through)."""
    return {
        "PATH": ":".join([*path_dirs, "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "GIT_CONFIG_COUNT": "3",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
        "GIT_CONFIG_KEY_1": "user.name",
        "GIT_CONFIG_VALUE_1": "agent",
        "GIT_CONFIG_KEY_2": "user.email",
        "GIT_CONFIG_VALUE_2": "agent@sandbox",
    }


# --------------------------------------------------------------------------- backends
class Sandbox:
    """Runs shell commands in a workspace directory.

    Args:
        workspace: the host directory holding the repository (bound read-write).
        limits: resource limits for every command.
        mounts: extra host directories made visible read-only, ``{host_path: sandbox_path}``.
        python: the interpreter whose prefix is exposed and put first on ``PATH``.
    """

    kind = "base"
    workdir = WORKDIR

    def __init__(self, workspace: str | Path, limits: Limits | None = None,
                 mounts: dict[str, str] | None = None, python: str | None = None):
        self.workspace = Path(workspace).resolve()
        self.limits = limits or Limits()
        self.mounts = dict(mounts or {})
        self.python = python or sys.executable
        self.closed = False

    def path(self, sandbox_path: str) -> str:
        """Where a mounted directory appears to commands."""
        return sandbox_path

    def run(self, command: str, *, timeout_s: float | None = None, output_bytes: int | None = None) -> CommandResult:
        """Run ``command`` with ``bash -c`` in the workspace; never raises for a bad command."""
        if self.closed:
            return CommandResult("", None, error="the sandbox is closed")
        if "\x00" in command:
            return CommandResult("", None, error="the command contains a NUL byte")
        return self._run(command, timeout_s or self.limits.timeout_s, output_bytes or self.limits.output_bytes)

    def disk_watch(self) -> Callable[[], str]:
        """A ``watch`` for :func:`run_bounded` that stops a command filling the workspace's filesystem."""
        start = free_bytes(self.workspace)
        quota = self.limits.disk_mb * 1024 * 1024

        def watch() -> str:
            if start - free_bytes(self.workspace) > quota:
                return f"disk quota: the command wrote more than {self.limits.disk_mb} MiB and was stopped"
            return ""

        return watch

    def workspace_bytes(self) -> int:
        """The workspace's size on disk (files are not followed through symlinks)."""
        total = 0
        for dirpath, _, filenames in os.walk(self.workspace):
            for name in filenames:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
                except OSError:
                    pass
        return total

    def _run(self, command: str, timeout_s: float, output_bytes: int) -> CommandResult:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True


class LocalSandbox(Sandbox):
    """rlimits and a process group only: commands see the whole host. Opt-in, warns loudly."""

    kind = "local"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.workdir = str(self.workspace)
        warnings.warn(
            "SWE sandbox='local' gives NO isolation: agent commands run as this user with full access to the "
            "host's files and network (only rlimits apply). Install bubblewrap (apt-get install bubblewrap) "
            "and use sandbox='bwrap' for untrusted agents.",
            RuntimeWarning,
            stacklevel=3,
        )

    def path(self, sandbox_path: str) -> str:
        for host, inside in self.mounts.items():
            if sandbox_path == inside or sandbox_path.startswith(inside.rstrip("/") + "/"):
                return host + sandbox_path[len(inside.rstrip("/")):]
        return sandbox_path

    def _run(self, command: str, timeout_s: float, output_bytes: int) -> CommandResult:
        env = sandbox_env([str(Path(self.python).parent)], str(self.workspace))
        return run_bounded(["bash", "-c", command], timeout_s=timeout_s, output_bytes=output_bytes,
                           env=env, cwd=str(self.workspace), limits=self.limits, watch=self.disk_watch())


class BwrapSandbox(Sandbox):
    """bubblewrap: read-only minimal root, private /tmp, no network, own PID namespace, uid 65534."""

    kind = "bwrap"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mode = bwrap_mode()
        self.uid = SANDBOX_UID
        if self.mode == "setpriv":
            self.uid = secrets.SystemRandom().randrange(*PRIVATE_UID_RANGE)
            chown_tree(self.workspace, self.uid)
            for host in self.mounts:  # read-only mounts stay readable for the private uid
                os.chmod(host, os.stat(host).st_mode | 0o555)

    def argv(self, command: str) -> list[str]:
        """The full bwrap command line for ``command``."""
        lim = self.limits
        # The private /tmp comes first: a venv or checkout that lives under the host's /tmp is bound
        # on top of it below, instead of being hidden by it.
        args = ["bwrap", "--tmpfs", "/", "--perms", "1777", "--size", str(lim.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            p = Path("/") / name
            if p.is_symlink():
                args += ["--symlink", os.readlink(p), str(p)]
            elif p.is_dir():
                args += ["--ro-bind", str(p), str(p)]
        made: set[str] = {"/", "/tmp"}
        for src in ("/usr", "/etc", *python_prefixes(self.python)):
            args += _parents(src, made) + ["--ro-bind", src, src]
        for secret in _HIDDEN_FILES:  # in the userns fallback root-owned files would be readable
            if os.path.isfile(secret):
                args += ["--ro-bind", "/dev/null", secret]
        for secret_dir in _HIDDEN_DIRS:
            if os.path.isdir(secret_dir):
                args += ["--tmpfs", secret_dir]
        for host, inside in self.mounts.items():
            args += _parents(inside, made) + ["--ro-bind", host, inside]
        args += ["--proc", "/proc", "--dev", "/dev", "--bind", str(self.workspace), WORKDIR, "--remount-ro", "/",
                 "--chdir", WORKDIR, "--hostname", "sandbox", "--unshare-ipc", "--unshare-pid", "--unshare-net",
                 "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
        if self.mode == "userns":
            args += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        args.append("--")
        if self.mode == "setpriv":
            args += ["setpriv", "--reuid", str(self.uid), "--regid", str(self.uid), "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--"]
        return [*args, "bash", "-c", command]

    def _run(self, command: str, timeout_s: float, output_bytes: int) -> CommandResult:
        env = sandbox_env([str(Path(self.python).parent)], "/tmp")
        return run_bounded(self.argv(command), timeout_s=timeout_s, output_bytes=output_bytes, env=env,
                           limits=self.limits, watch=self.disk_watch())


def free_bytes(path: Path) -> int:
    """Bytes free to unprivileged users on the filesystem holding ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _parents(path: str, made: set[str]) -> list[str]:
    """bwrap args creating the (world-readable) parent directories of ``path``."""
    args: list[str] = []
    parts = Path(path).parts
    for i in range(2, len(parts)):
        d = str(Path(*parts[:i]))
        if d not in made:
            made.add(d)
            args += ["--perms", "0755", "--dir", d]
    return args


def python_prefixes(python: str) -> list[str]:
    """The directories an interpreter needs at run time (venv and base install), outside /usr."""
    exe = Path(python)
    prefixes = {str(exe.parent.parent.absolute())}
    prefixes.add(str(exe.resolve().parent.parent))
    if Path(python).absolute() == Path(sys.executable).absolute():
        prefixes |= {sys.prefix, sys.base_prefix}
    keep = sorted(p for p in prefixes if not (p == "/usr" or p.startswith(("/usr/", "/etc/"))) and p != "/")
    # drop prefixes nested in another kept prefix
    return [p for p in keep if not any(p != q and p.startswith(q + "/") for q in keep)]


def chown_tree(root: Path, uid: int) -> None:
    """Give ``root`` and everything under it to ``uid`` (never following symlinks)."""
    os.lchown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


@functools.lru_cache(maxsize=1)
def bwrap_mode() -> str:
    """How bwrap runs here: ``setpriv`` (root: real uid drop), ``userns`` or ``unprivileged``.

    Raises:
        SandboxUnavailable: bubblewrap is missing or cannot create namespaces here.
    """
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable(
            "bubblewrap is not installed: apt-get install bubblewrap (or pass sandbox='docker' where a Docker "
            "engine runs, or sandbox='local' to run agent commands unisolated)"
        )
    base = ["bwrap", "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--die-with-parent"]
    tries: list[tuple[str, list[str]]] = []
    if os.geteuid() == 0 and shutil.which("setpriv"):
        tries.append(("setpriv", [*base, "--", "setpriv", "--reuid", str(SANDBOX_UID), "--regid",
                                  str(SANDBOX_UID), "--clear-groups", "true"]))
    tries.append(("userns", [*base, "--unshare-user", "--uid", str(SANDBOX_UID), "--", "true"]))
    tries.append(("unprivileged", [*base, "--", "true"]))
    errors = []
    for mode, argv in tries:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode == 0:
            return mode
        errors.append(f"{mode}: {proc.stderr.strip()}")
    raise SandboxUnavailable(
        "bubblewrap is installed but cannot create a sandbox here (" + "; ".join(errors) + "). In a container, "
        "allow user namespaces (e.g. docker run --security-opt seccomp=unconfined) or use sandbox='docker'."
    )
