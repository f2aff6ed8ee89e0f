"""Both sandboxes, bwrap and docker, contain hostile commands: each attempt fails or is stopped,
the command returns with a clear status, and the host is unchanged. Every attempt runs on both
(the ``docker`` cases are marked ``docker`` and skip, saying why, where no engine can run); the
limits are the same and tight, to keep these fast.

Run with ``-s`` to see what each attempt got (lines starting with ``SECURITY``).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

import gymnasium as gym
import pytest

import crl_envs  # noqa: F401
from tests.docker_support import docker_engine, docker_images  # noqa: F401 - fixtures
from tests.swe_support import require_bwrap

pytest.importorskip("swebench")

from crl_envs.swe import grading as grading_mod  # noqa: E402
from crl_envs.swe.bundled import bundled_instances, bundled_repos_dir  # noqa: E402
from crl_envs.swe.instances import find_repo_source  # noqa: E402
from crl_envs.swe.sandbox import (  # noqa: E402
    PRIVATE_UID_RANGE,
    SANDBOX_UID,
    BwrapSandbox,
    Limits,
    Sandbox,
    bwrap_mode,
)
from crl_envs.swe.sandboxes import make_sandbox  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TIGHT = Limits(timeout_s=8, cpu_s=2, memory_mb=768, file_size_mb=16, nproc=64, tmp_mb=32, output_bytes=4096)


def _report(attempt: str, result, timeout_s: float = TIGHT.timeout_s) -> None:
    print(f"\nSECURITY {attempt}: {result.status_line(timeout_s)} :: {result.output.strip()[-200:]!r}")


def _procs_with(marker: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def kind(request) -> str:
    """The sandbox under test; skips, saying why, where it cannot run here."""
    if request.param == "bwrap":
        require_bwrap()
    else:
        request.getfixturevalue("docker_images")
    return request.param


def _box(kind: str, ws: Path, limits: Limits = TIGHT) -> Sandbox:
    """A sandbox over the host directory ``ws`` (docker: bound at /testbed of the base image)."""
    return make_sandbox(kind, ws, limits)


@pytest.fixture
def sandbox(kind, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "hello.txt").write_text("hi\n")
    sb = _box(kind, ws)
    yield sb
    sb.close()


def test_uid_is_dropped_and_the_sandbox_still_works(sandbox):
    res = sandbox.run("id -u; echo data > made.txt; python -c 'print(2 + 2)'; cat hello.txt")
    _report(f"uid drop ({sandbox.kind})", res)
    assert res.exit_code == 0 and "4\n" in res.output and "hi" in res.output
    assert (sandbox.workspace / "made.txt").read_text() == "data\n"
    if os.geteuid() == 0:
        if sandbox.kind == "bwrap":
            assert bwrap_mode() == "setpriv"
        assert res.output.split()[0] == str(sandbox.uid) and sandbox.uid >= PRIVATE_UID_RANGE[0]
        assert (sandbox.workspace / "made.txt").stat().st_uid == sandbox.uid
    # stderr of ls (no /etc/ssh in the image) would race wc's count in the merged output: drop it
    shadow = sandbox.run("cat /etc/shadow; ls -A /etc/ssh 2>/dev/null | wc -l")
    _report("read /etc/shadow", shadow)
    assert "root:" not in shadow.output and shadow.output.split()[-1] == "0"


def test_writes_outside_the_workspace_fail_and_the_host_is_unchanged(sandbox):
    tag = uuid.uuid4().hex[:8]
    home = Path(os.path.expanduser("~"))
    targets = [Path("/etc") / f"crl_probe_{tag}", home / f"crl_probe_{tag}", REPO / f"crl_probe_{tag}",
               Path("/tmp") / f"crl_probe_{tag}", sandbox.workspace.parent / f"crl_probe_{tag}"]
    cmd = "; ".join(f"echo pwned > {t}" for t in targets[:3]) + f"; echo pwned > /tmp/crl_probe_{tag} && echo tmp-ok"
    cmd += f"; echo pwned > ../crl_probe_{tag}; rm -rf /usr/bin/git 2>&1 | tail -1"
    res = sandbox.run(cmd)
    _report(f"write /etc, $HOME, checkout, /tmp, ../, rm /usr/bin/git ({sandbox.kind})", res)
    assert "Read-only file system" in res.output or "No such file" in res.output
    assert "tmp-ok" in res.output  # the private /tmp works, and vanishes with the command
    assert not any(t.exists() for t in targets)
    assert Path("/usr/bin/git").exists()


def test_secret_files_outside_the_workspace_cannot_be_read(sandbox, tmp_path):
    secret = f"S3CRET-{uuid.uuid4().hex}"
    planted = [tmp_path / "secret.txt", REPO / f".crl_secret_probe_{secret[-6:]}"]
    try:
        for p in planted:
            p.write_text(secret)
            p.chmod(0o644)  # world-readable: only the mount layout protects it
        res = sandbox.run("; ".join(f"cat {p}" for p in planted) + "; ls /root /work 2>&1; env")
        _report(f"read planted secrets ({sandbox.kind})", res)
        assert secret not in res.output and "No such file" in res.output
        assert "OPENAI" not in res.output and "PYTEST_CURRENT_TEST" not in res.output  # host env is not passed on
    finally:
        for p in planted:
            p.unlink(missing_ok=True)


def test_network_connections_fail_even_to_a_loopback_server(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    res = sandbox.run(
        f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)\" 2>&1 | tail -1; "
        f"(echo hi > /dev/tcp/127.0.0.1/{port}) 2>&1; (echo hi > /dev/tcp/8.8.8.8/53) 2>&1; ip -brief link 2>&1"
    )
    server.setblocking(False)
    with pytest.raises(BlockingIOError):  # a completed handshake would be waiting in the backlog
        server.accept()
    server.close()
    _report(f"connect to loopback server / 8.8.8.8 ({sandbox.kind})", res)
    assert "Connection refused" in res.output and "unreachable" in res.output


def test_a_fork_bomb_is_capped_and_leaves_nothing_behind(sandbox):
    marker = f"crlbomb{uuid.uuid4().hex[:6]}"
    start = time.monotonic()
    res = sandbox.run(f"{marker}() {{ {marker} | {marker} & }}; {marker}; sleep 2; echo survived")
    took = time.monotonic() - start
    _report(f"fork bomb ({sandbox.kind})", res)
    assert took < TIGHT.timeout_s + 3
    assert "Resource temporarily unavailable" in res.output or res.timed_out
    time.sleep(0.5)
    assert _procs_with(marker) == []


def test_a_memory_hog_gets_memory_error(kind, tmp_path):
    # A roomier CPU limit than TIGHT, so that on a loaded machine the memory limit, not the CPU
    # limit, is what stops the hog (zero-filling 768 MB of pages costs CPU time).
    import dataclasses

    ws = tmp_path / "ws"
    ws.mkdir()
    sb = _box(kind, ws, dataclasses.replace(TIGHT, cpu_s=20, timeout_s=30))
    try:
        res = sb.run("python -c 'x = []\nwhile True: x.append(bytearray(50 * 1024 * 1024))'")
    finally:
        sb.close()
    _report(f"memory hog ({kind})", res)
    assert res.exit_code not in (0, None) and "MemoryError" in res.output


def test_an_infinite_loop_is_stopped_by_the_cpu_limit_or_the_timeout(sandbox):
    start = time.monotonic()
    res = sandbox.run("while :; do :; done")
    _report(f"infinite loop (CPU limit) ({sandbox.kind})", res)
    assert time.monotonic() - start < TIGHT.timeout_s + 3
    # SIGXCPU at the soft limit; a SIGKILL is the hard limit, reached only if accounting jumped.
    assert "SIGXCPU" in res.status_line() or res.timed_out or (res.exit_code == 137 and res.duration_s >= TIGHT.cpu_s)
    res = sandbox.run("sleep 100", timeout_s=1.0)
    _report(f"sleep past the wall clock ({sandbox.kind})", res, 1.0)
    assert res.timed_out and "wall-clock timeout" in res.status_line(1.0)


def test_a_10_gb_file_is_stopped_by_the_file_size_limit(sandbox):
    res = sandbox.run("head -c 10G /dev/zero > big.bin; ls -l big.bin; fallocate -l 10G big2.bin 2>&1; "
                      "head -c 10G /dev/zero > /tmp/big.bin")
    _report(f"write a 10 GB file ({sandbox.kind})", res)
    assert "File size limit exceeded" in res.output
    assert (sandbox.workspace / "big.bin").stat().st_size <= TIGHT.file_size_mb * 1024 * 1024
    assert not (sandbox.workspace / "big2.bin").exists() or (sandbox.workspace / "big2.bin").stat().st_size == 0


def test_background_processes_die_with_the_command_and_the_episode(sandbox):
    marker = f"crlbg{uuid.uuid4().hex[:6]}"
    res = sandbox.run(f"(setsid nohup bash -c 'exec -a {marker} sleep 300' >/dev/null 2>&1 &); "
                      f"nohup bash -c 'while :; do sleep 1; done # {marker}' >/dev/null 2>&1 & echo started")
    _report(f"leave background processes ({sandbox.kind})", res)
    assert "started" in res.output and res.duration_s < 5
    time.sleep(0.5)
    assert _procs_with(marker) == []
    env = gym.make("crl/SWE-Mini-v0", sandbox=sandbox.kind)
    env.reset(seed=0)
    env.step(f"nohup bash -c 'sleep 300 # {marker}' >/dev/null 2>&1 &")
    env.close()
    time.sleep(0.5)
    assert _procs_with(marker) == []


def _grade_keeping_dir(monkeypatch, tmp_path, inst, patch, kind):
    eval_dirs: list[Path] = []
    real_mkdtemp = grading_mod.tempfile.mkdtemp

    def mkdtemp(prefix=""):
        d = Path(real_mkdtemp(prefix=prefix, dir=tmp_path))
        eval_dirs.append(d)
        return str(d)

    monkeypatch.setattr(grading_mod.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(grading_mod.shutil, "rmtree", lambda *a, **k: None)
    g = grading_mod.grade_patch(inst, patch, source=find_repo_source(inst, bundled_repos_dir()), sandbox=kind,
                                limits=TIGHT)
    return g, eval_dirs[0]


@pytest.mark.parametrize(
    ("name", "patch"),
    [
        ("dotdot", "diff --git a/../escape.txt b/../escape.txt\nnew file mode 100644\n--- /dev/null\n"
                   "+++ b/../escape.txt\n@@ -0,0 +1 @@\n+pwned\n"),
        ("absolute", "--- /dev/null\n+++ /tmp/crl_abs_escape.txt\n@@ -0,0 +1 @@\n+pwned\n"),
        ("symlink", "diff --git a/evil b/evil\nnew file mode 120000\n--- /dev/null\n+++ b/evil\n@@ -0,0 +1 @@\n"
                    "+..\n\\ No newline at end of file\ndiff --git a/evil/escape.txt b/evil/escape.txt\n"
                    "new file mode 100644\n--- /dev/null\n+++ b/evil/escape.txt\n@@ -0,0 +1 @@\n+pwned\n"),
    ],
)
def test_path_tricks_in_a_patch_cannot_escape_the_checkout(kind, monkeypatch, tmp_path, name, patch):
    inst = bundled_instances()[0]
    g, eval_dir = _grade_keeping_dir(monkeypatch, tmp_path, inst, patch, kind)
    print(f"\nSECURITY patch path trick ({name}, {kind}): applied={g.patch_applied} resolved={g.resolved} "
          f"log={g.log.strip().splitlines()[:3]!r}")
    assert not g.resolved
    checkout = ["repo"] if kind == "bwrap" else []  # docker grades in the image's own /testbed
    assert sorted(p.name for p in eval_dir.iterdir()) == sorted(["patches", *checkout, "test_output.txt"])
    assert not (tmp_path / "escape.txt").exists() and not Path("/tmp/crl_abs_escape.txt").exists()
    assert not (eval_dir / "escape.txt").exists() and not (eval_dir / "patches" / "escape.txt").exists()


def test_a_poisoned_git_config_in_the_workspace_never_runs_on_the_host(kind, tmp_path):
    marker = Path("/tmp") / f"crl_fsmonitor_{uuid.uuid4().hex[:8]}"
    env = gym.make("crl/SWE-Mini-v0", sandbox=kind)
    env.reset(seed=0)
    obs, *_ = env.step(f"git config core.fsmonitor 'touch {marker}; false' && "
                       f"printf '#!/bin/sh\\ntouch {marker}\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit"
                       " && ln -s /etc/shadow leak && echo poisoned")
    assert "poisoned" in obs
    obs, reward, term, trunc, info = env.step("submit")
    env.close()
    print(f"\nSECURITY poisoned .git/config + symlink to /etc/shadow ({kind}): reward={reward} patch="
          f"{info['model_patch'][:120]!r}")
    assert term and reward == 0 and not marker.exists()
    assert "leak" in info["model_patch"] and "root:" not in info["model_patch"]


def test_the_user_namespace_fallback_also_drops_uid_and_hides_secrets(tmp_path, monkeypatch):
    from crl_envs.swe import sandbox as sandbox_mod

    require_bwrap()  # bwrap only: docker has no such fallback

    ws = tmp_path / "ws"
    ws.mkdir()
    # what runs where bwrap may not mount as real root (e.g. some containers)
    monkeypatch.setattr(sandbox_mod, "bwrap_mode", lambda: "userns")
    sb = BwrapSandbox(ws, TIGHT)
    probe = sb.run("true")
    if probe.exit_code != 0:
        pytest.skip(f"user namespaces are not available here: {probe.output.strip()}")
    res = sb.run("id -u; echo ok > made.txt && cat made.txt; cat /etc/shadow; ls /root; echo x > /etc/x")
    _report("userns fallback", res)
    assert res.output.split()[:2] == [str(SANDBOX_UID), "ok"]
    assert "root:" not in res.output and "Read-only file system" in res.output


def test_filling_the_disk_with_many_files_is_stopped_and_ends_the_episode(kind, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    sb = _box(kind, ws, Limits(timeout_s=20, file_size_mb=16, disk_mb=64))
    res = sb.run("for i in $(seq 1000); do head -c 16M /dev/zero > f$i; sleep 0.05; done")
    sb.close()
    _report(f"fill the disk with 16 MB files ({kind})", res)
    written = sum(f.stat().st_size for f in ws.iterdir())
    assert "disk quota" in res.status_line() and written < 400 * 1024 * 1024 and res.duration_s < 15
    env = gym.make("crl/SWE-Mini-v0", sandbox=kind, limits={"disk_mb": 32, "file_size_mb": 16})
    env.reset(seed=0)
    workdir = env.unwrapped._sandbox.workspace  # bwrap: the checkout; docker: the /testbed volume on the host
    assert workdir.is_dir()
    obs, reward, term, trunc, info = env.step("for i in 1 2 3 4; do head -c 16M /dev/zero > f$i; done; echo wrote")
    print(f"\nSECURITY disk quota in the env ({kind}): term={term} reward={reward} :: {obs.split('# How to act')[0][-160:]!r}")
    assert term and reward == 0 and info["disk_quota_exceeded"] and "disk quota" in obs
    assert not workdir.exists()
    env.close()


def test_a_fork_bomb_in_one_sandbox_does_not_starve_another(kind, tmp_path):
    import threading

    boxes = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        boxes.append(_box(kind, tmp_path / name))
    if os.geteuid() == 0:
        assert boxes[0].uid != boxes[1].uid
    bomb = threading.Thread(target=boxes[0].run, args=("b() { b | b & }; b; sleep 4",))
    bomb.start()
    time.sleep(1.5)
    res = boxes[1].run("for i in $(seq 30); do (sleep 0.2) & done; wait; echo neighbour-ok")
    bomb.join()
    for box in boxes:
        box.close()
    _report(f"neighbour sandbox during a fork bomb ({kind})", res)
    assert "neighbour-ok" in res.output and "Resource temporarily unavailable" not in res.output


def test_an_interpreter_under_the_hosts_tmp_stays_visible_behind_the_private_tmp(tmp_path):
    # CI clones (and so their venvs) may live under /tmp, which the sandbox replaces with a tmpfs.
    import subprocess
    import sys

    require_bwrap()  # bwrap only: docker uses the image's interpreter

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    work = tmp_path / "ws"
    work.mkdir()
    box = BwrapSandbox(work, TIGHT, python=str(venv / "bin" / "python"))
    result = box.run("python -c 'import sys; print(sys.prefix)' && touch /tmp/x && ls /tmp")
    assert result.exit_code == 0, result.output
    assert str(venv) in result.output and "x" in result.output.split()
