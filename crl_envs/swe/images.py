"""Docker images for the ``docker`` sandbox, built locally (no registry pull, ever).

The layering and names follow the SWE-bench harness:

* base: ``sweb.base.py.x86_64:latest``, a minimal Debian root filesystem made with
  ``debootstrap --variant=minbase`` from the mirror apt uses (or a root-filesystem tarball
  you supply) and ``docker import``-ed: bash, git, patch, Python 3, util-linux;
* env: ``sweb.env.py.x86_64.<hash>:latest`` per repository/version, a virtualenv at
  ``/opt/testbed`` (first on ``PATH``) holding the repository's test dependencies, downloaded
  on the host by pip (so the host's index and proxy settings apply) and installed in a build
  without network; ``<hash>`` covers the base image, the repo, the version and the packages;
* instance: ``sweb.eval.x86_64.<instance_id>:latest`` (swebench's ``ImageSpec.name`` for a local
  image), the repository at ``base_commit`` in ``/testbed`` with only history up to it.

Official harness images (``swebench/sweb.eval.x86_64.<id>:latest``, or an instance's ``image``
field) that are already in the engine are used as they are. A missing image is an
:class:`ImageMissing` error naming the build command::

    python -m crl_envs.swe.images build --bundled                 # crl/SWE-Mini-v0
    python -m crl_envs.swe.images build --instances lite.jsonl --repos-dir $SWE_REPOS --pip 'pytest==8.3.3'
    python -m crl_envs.swe.images build --bundled --rootfs rootfs.tar   # base from your own tarball
    python -m crl_envs.swe.images status --bundled
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from crl_envs.swe.instances import SWEInstance, checkout, find_repo_source, load_instances
from crl_envs.swe.sandbox import SandboxUnavailable

BASE_IMAGE = "sweb.base.py.x86_64:latest"
ENV_PREFIX = "sweb.env.py.x86_64."
LABEL = "crl-bench.swe.image"  # base | env | instance: images this module built
COMMIT_LABEL = "crl-bench.swe.base_commit"
SUITE = "bookworm"
# What every command and grading script needs: a shell, git and patch (the harness applies patches
# with both), Python, and util-linux (prlimit, setsid) which the sandbox wraps commands with.
BASE_PACKAGES = ("bash", "git", "patch", "ca-certificates", "python3", "python-is-python3", "util-linux", "procps")
BUILD_TIMEOUT_S = 1800
BUILD_HINT = "python -m crl_envs.swe.images build"


class ImageMissing(SandboxUnavailable):
    """No image for an instance is in the engine; the message names the build command."""


class ImageBuildError(RuntimeError):
    """Building an image failed; the message holds the tail of the build log."""


def docker(*args: str, timeout: float = 60, stdin: bytes | None = None, check: bool = True) -> str:
    """Run a docker CLI command; a failure or a timeout raises :class:`ImageBuildError` with its output."""
    try:
        proc = subprocess.run(["docker", *args], input=stdin, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise ImageBuildError(f"`docker {' '.join(args[:2])}` did not finish within {timeout:g} s") from e
    except OSError as e:
        raise ImageBuildError(f"the docker CLI could not run: {e}") from e
    out = proc.stdout.decode(errors="replace")
    if check and proc.returncode != 0:
        err = (proc.stderr.decode(errors="replace") or out).strip()
        raise ImageBuildError(f"`docker {' '.join(args[:2])}` failed: {err[-1500:]}")
    return out


def image_labels(name: str) -> dict[str, str] | None:
    """The labels of image ``name``, or ``None`` when the engine does not hold it."""
    try:
        proc = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", name],
                              capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired as e:
        raise SandboxUnavailable(f"the Docker engine did not answer `docker image inspect` within 30 s ({e})") from e
    if proc.returncode != 0:
        if "No such image" in proc.stderr or "No such object" in proc.stderr:
            return None
        raise SandboxUnavailable(f"`docker image inspect {name}` failed: {proc.stderr.strip()[:500]}")
    return json.loads(proc.stdout.strip() or "null") or {}


# --------------------------------------------------------------------------- names
def instance_image_name(inst: SWEInstance) -> str:
    """The local instance image name, as swebench's ``ImageSpec.name`` gives it without a namespace."""
    return f"sweb.eval.x86_64.{inst.instance_id}:latest".lower()


def official_image_name(inst: SWEInstance, namespace: str = "swebench") -> str:
    """The published harness image name (Docker Hub forbids ``__``, hence ``_1776_``)."""
    return f"{namespace}/sweb.eval.x86_64.{inst.instance_id}:latest".replace("__", "_1776_").lower()


def env_packages(inst: SWEInstance, extra: Sequence[str] = ()) -> list[str]:
    """The pip requirements of an instance's env image.

    ``pytest`` pinned to the host's version (the version our graders are tested with), then the
    instance's ``env_pip`` field (a list, from the instance file's extra columns), then ``extra``.
    """
    pkgs = [f"pytest=={importlib.metadata.version('pytest')}"]
    own = inst.extra.get("env_pip") or []
    if isinstance(own, str):
        own = own.split()
    return [*pkgs, *[str(p) for p in own], *extra]


def env_image_name(inst: SWEInstance, packages: Sequence[str], base_id: str) -> str:
    """``sweb.env.py.x86_64.<hash>:latest``; the hash covers everything the image is made of."""
    blob = json.dumps([base_id, inst.repo, inst.version, sorted(packages)])
    return f"{ENV_PREFIX}{hashlib.sha256(blob.encode()).hexdigest()[:22]}:latest"


def resolve_image(inst: SWEInstance) -> str:
    """The image an instance runs in: its ``image`` field, the official image, or our local build.

    Raises:
        ImageMissing: none is in the engine (never pulled); the message names the build command.
    """
    candidates = [c for c in (inst.image, official_image_name(inst)) if c]
    for name in candidates:
        if image_labels(name) is not None:
            return name
    local = instance_image_name(inst)
    labels = image_labels(local)
    hint = f"{BUILD_HINT} {'--bundled' if inst.repo.startswith('crl-mini/') else '--instances FILE'} " \
           f"--ids {inst.instance_id}"
    if labels is None:
        tried = ", ".join([*candidates, local])
        raise ImageMissing(f"no Docker image for {inst.instance_id} in the engine (looked for {tried}); images are "
                           f"never pulled: build it with `{hint}`")
    built_at = labels.get(COMMIT_LABEL, "")
    if built_at and built_at != inst.base_commit:
        raise ImageMissing(f"the image {local} holds commit {built_at[:12]}, not {inst.instance_id}'s base_commit "
                           f"{inst.base_commit[:12]}: rebuild it with `{hint} --force`")
    return local


# --------------------------------------------------------------------------- builds
def debian_mirror() -> str:
    """The Debian mirror apt uses (from ``/etc/apt/sources.list*``)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        if not path.is_file() or not path.name.endswith((".list", ".sources")):
            continue
        for line in path.read_text(errors="replace").splitlines():
            words = line.split()
            if path.name.endswith(".list") and len(words) >= 3 and words[0] == "deb" and "security" not in line:
                return next(w for w in words[1:] if "://" in w)
            if words[:1] == ["URIs:"] and len(words) > 1 and "security" not in words[1]:
                return words[1]
    return "http://deb.debian.org/debian"


def build_base(rootfs: str | os.PathLike | None = None, *, mirror: str | None = None, force: bool = False,
               name: str = BASE_IMAGE, log=print) -> str:
    """Import the base image ``name`` from ``rootfs`` (a tar of a root filesystem) or a fresh debootstrap."""
    if not force and image_labels(name) is not None:
        return name
    changes = ["ENV LANG=C.UTF-8", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               f"LABEL {LABEL}=base", "CMD [\"bash\"]"]
    change_args = [a for c in changes for a in ("--change", c)]
    if rootfs is not None:
        path = Path(rootfs)
        if not path.is_file():
            raise ImageBuildError(f"root filesystem tarball not found: {path}")
        log(f"importing {path} as {name}")
        docker("import", *change_args, str(path), name, timeout=BUILD_TIMEOUT_S)
        return name
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        raise ImageBuildError("building the base image needs debootstrap, as root (apt-get install debootstrap), "
                              "or a root filesystem tarball: --rootfs rootfs.tar")
    mirror = mirror or debian_mirror()
    with tempfile.TemporaryDirectory(prefix="crl-rootfs-") as tmp:
        root = Path(tmp) / "root"
        log(f"debootstrap --variant=minbase {SUITE} from {mirror} (about a minute)")
        proc = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE,
                               str(root), mirror], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            raise ImageBuildError(f"debootstrap failed: {(proc.stdout + proc.stderr).strip()[-1500:]}")
        shutil.rmtree(root / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        try:
            imp = subprocess.run(["docker", "import", *change_args, "-", name], stdin=tar.stdout,
                                 capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
        if imp.returncode != 0:
            raise ImageBuildError(f"docker import failed: {imp.stderr.strip()[-1500:]}")
    return name


def _build(tag: str, context: Path, dockerfile: str, labels: dict[str, str]) -> None:
    (context / "Dockerfile").write_text(dockerfile)
    args = ["build", "--network", "none", "--pull=false", "-t", tag, "-f", str(context / "Dockerfile")]
    for k, v in labels.items():
        args += ["--label", f"{k}={v}"]
    docker(*args, str(context), timeout=BUILD_TIMEOUT_S)


def _image_id(name: str) -> str:
    return docker("image", "inspect", "--format", "{{.Id}}", name).strip()


def build_env(inst: SWEInstance, packages: Sequence[str], *, force: bool = False, log=print) -> str:
    """The env image of ``inst``'s repository/version: a venv at /opt/testbed with ``packages``."""
    name = env_image_name(inst, packages, _image_id(BASE_IMAGE))
    if not force and image_labels(name) is not None:
        return name
    py = docker("run", "--rm", "--network", "none", "--pull=never", BASE_IMAGE, "python3", "-c",
                "import sys; print('%d.%d' % sys.version_info[:2])").strip()
    log(f"building {name} for {inst.repo} {inst.version or ''}: {' '.join(packages)}")
    with tempfile.TemporaryDirectory(prefix="crl-env-") as tmp:
        wheels = Path(tmp) / "wheels"
        # pip on the host downloads (the host's index, proxy and certificates apply); the build has no network
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                               "--python-version", py, "-d", str(wheels), "pip", *packages],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            raise ImageBuildError(f"pip download of {' '.join(packages)} failed: {proc.stderr.strip()[-1500:]}")
        pip_wheel = next(p.name for p in wheels.glob("pip-*.whl"))
        quoted = " ".join(f"'{p}'" for p in ["pip", *packages])
        dockerfile = (f"FROM {BASE_IMAGE}\nCOPY wheels /tmp/wheels\n"
                      f"RUN python3 -m venv --without-pip /opt/testbed && /opt/testbed/bin/python "
                      f"/tmp/wheels/{pip_wheel}/pip install -q --no-index --find-links /tmp/wheels {quoted} "
                      "&& rm -rf /tmp/wheels\n"
                      "ENV PATH=/opt/testbed/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n")
        _build(name, Path(tmp), dockerfile, {LABEL: "env", "crl-bench.swe.repo": inst.repo,
                                            "crl-bench.swe.version": inst.version})
    return name


def build_instance(inst: SWEInstance, env_image: str, repos_dir: str | os.PathLike | None, *,
                   force: bool = False, log=print) -> str:
    """The instance image: ``env_image`` plus the repository at ``base_commit`` in /testbed."""
    name = instance_image_name(inst)
    labels = image_labels(name)
    if not force and labels is not None and labels.get(COMMIT_LABEL) == inst.base_commit:
        return name
    log(f"building {name}")
    with tempfile.TemporaryDirectory(prefix="crl-inst-") as tmp:
        checkout(find_repo_source(inst, repos_dir), inst.base_commit, Path(tmp) / "testbed")
        dockerfile = f"FROM {env_image}\nCOPY testbed /testbed\nWORKDIR /testbed\n"
        _build(name, Path(tmp), dockerfile, {LABEL: "instance", COMMIT_LABEL: inst.base_commit,
                                            "crl-bench.swe.instance_id": inst.instance_id})
    return name


def build_images(instances: Iterable[SWEInstance], repos_dir: str | os.PathLike | None, *,
                 rootfs: str | os.PathLike | None = None, mirror: str | None = None, pip: Sequence[str] = (),
                 force: bool = False, log=print) -> dict[str, str]:
    """Build (or reuse) base, env and instance images; official images already present are kept.

    Returns:
        ``{instance_id: image}`` for every instance.
    """
    out: dict[str, str] = {}
    todo = []
    for inst in instances:
        official = next((c for c in (inst.image, official_image_name(inst)) if c and image_labels(c) is not None), "")
        if official and not force:
            log(f"{inst.instance_id}: using {official} as it is")
            out[inst.instance_id] = official
        else:
            todo.append(inst)
    if not todo:
        return out
    build_base(rootfs, mirror=mirror, force=force or rootfs is not None, log=log)  # a given tarball is imported
    envs: dict[str, str] = {}
    for inst in todo:
        packages = env_packages(inst, pip)
        key = json.dumps([inst.repo, inst.version, packages])
        if key not in envs:
            envs[key] = build_env(inst, packages, force=force, log=log)
        out[inst.instance_id] = build_instance(inst, envs[key], repos_dir, force=force, log=log)
    return out


# --------------------------------------------------------------------------- CLI
def _select(args: argparse.Namespace) -> tuple[list[SWEInstance], str | None]:
    if args.bundled:
        from crl_envs.swe.bundled import bundled_instances, bundled_repos_dir

        insts, repos = bundled_instances(), str(bundled_repos_dir())
    elif args.instances:
        insts, repos = load_instances(args.instances), args.repos_dir
    else:
        raise SystemExit("pass --bundled (crl/SWE-Mini-v0) or --instances FILE")
    if args.ids:
        wanted = set(args.ids)
        unknown = wanted - {i.instance_id for i in insts}
        if unknown:
            raise SystemExit(f"unknown instance ids: {', '.join(sorted(unknown))}")
        insts = [i for i in insts if i.instance_id in wanted]
    return insts, repos


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m crl_envs.swe.images {build,status}``."""
    ap = argparse.ArgumentParser(prog="python -m crl_envs.swe.images", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("build", "status"):
        p = sub.add_parser(name)
        p.add_argument("--bundled", action="store_true", help="the crl/SWE-Mini-v0 instances")
        p.add_argument("--instances", help="an instance file (.json/.jsonl/.parquet)")
        p.add_argument("--repos-dir", default=os.environ.get("SWE_REPOS"), help="where the repositories are")
        p.add_argument("--ids", nargs="*", help="only these instance ids")
        if name == "build":
            p.add_argument("--rootfs", help="a root filesystem tarball for the base image (instead of debootstrap)")
            p.add_argument("--mirror", help="the Debian mirror for debootstrap (default: the one apt uses)")
            p.add_argument("--pip", action="append", default=[], help="an extra pip requirement of the env images")
            p.add_argument("--force", action="store_true", help="rebuild images that exist")
    args = ap.parse_args(argv)
    insts, repos = _select(args)
    try:
        if args.cmd == "build":
            images = build_images(insts, repos, rootfs=args.rootfs, mirror=args.mirror, pip=args.pip,
                                  force=args.force)
            print(f"{len(images)} instance images ready")
            return 0
        missing = 0
        for inst in insts:
            try:
                print(f"{inst.instance_id}: {resolve_image(inst)}")
            except ImageMissing as e:
                missing += 1
                print(f"{inst.instance_id}: MISSING ({e})")
        return 1 if missing else 0
    except (ImageBuildError, SandboxUnavailable, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
