"""The docker sandbox against a real engine: local images, one container per episode, parity with
bwrap, and failures (missing image, engine gone, container killed, disk-full or hung engine).

Tests marked ``docker`` need an engine (``tests.docker_support`` starts dockerd where it can) and
skip, saying why, elsewhere. The fake-engine tests at the end run everywhere.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest

import crl_envs  # noqa: F401
from tests.docker_support import docker_engine, docker_images  # noqa: F401 - fixtures

pytest.importorskip("swebench")

from crl_envs.swe import docker_sandbox as ds  # noqa: E402
from crl_envs.swe.bundled import bundled_instances  # noqa: E402
from crl_envs.swe.images import (  # noqa: E402
    BASE_IMAGE,
    COMMIT_LABEL,
    ImageMissing,
    image_labels,
    instance_image_name,
    official_image_name,
    resolve_image,
)
from crl_envs.swe.sandbox import SandboxFailure  # noqa: E402


@pytest.fixture(scope="module")
def insts():
    return bundled_instances()


def _containers(owner: str | None = None) -> list[str]:
    label = f"{ds.OWNER_LABEL}={owner}" if owner else ds.LABEL
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True,
                         check=True).stdout
    return out.split()


def _play(env, policy, options):
    observations = [env.reset(options=options)[0]]
    for _ in range(50):
        obs, reward, term, trunc, info = env.step(policy(env))
        observations.append(obs)
        if term or trunc:
            return reward, info, observations
    raise AssertionError("episode did not end")


# --------------------------------------------------------------------------- images
@pytest.mark.docker
def test_bundled_instances_get_base_env_and_instance_images_named_as_swebench_does(request, insts):
    images = request.getfixturevalue("docker_images")
    assert set(images) == {i.instance_id for i in insts}
    assert image_labels(BASE_IMAGE) is not None
    inst = insts[0]
    name = images[inst.instance_id]
    assert name == f"sweb.eval.x86_64.{inst.instance_id}:latest" == instance_image_name(inst)
    assert official_image_name(inst) == f"swebench/sweb.eval.x86_64.{inst.instance_id.replace('__', '_1776_')}:latest"
    assert image_labels(name)[COMMIT_LABEL] == inst.base_commit and resolve_image(inst) == name
    parent = subprocess.run(["docker", "history", "--format", "{{.CreatedBy}}", name], capture_output=True,
                            text=True, check=True).stdout
    assert "/opt/testbed" in parent  # the env layer (the venv with pytest) sits under the instance layer
    box = ds.DockerSandbox(inst)
    try:
        res = box.run("git rev-parse HEAD; git log --all --oneline | wc -l; python -m pytest --version")
    finally:
        box.close()
    head, commits, pytest_line = res.output.split("\n")[:3]
    assert head == inst.base_commit and commits == "2" and pytest_line.startswith("pytest ")  # no later history


@pytest.mark.docker
@pytest.mark.usefixtures("docker_images")
def test_a_missing_image_is_a_clear_error_naming_the_build_command_and_nothing_is_pulled(insts):
    ghost = replace(insts[0], instance_id="crl-mini__ghost-1")
    def image_ids() -> list[str]:  # as a sorted list: images created in the same second list in any order
        return sorted(subprocess.run(["docker", "images", "-q"], capture_output=True, text=True, check=True).stdout.split())

    before = image_ids()
    start = time.monotonic()
    with pytest.raises(ImageMissing, match=r"never pulled: build it with `python -m crl_envs\.swe\.images build "
                                           r"--bundled --ids crl-mini__ghost-1`"):
        ds.DockerSandbox(ghost)
    assert time.monotonic() - start < 10
    assert image_ids() == before
    stale = replace(insts[0], base_commit="0" * 40)
    with pytest.raises(ImageMissing, match=r"holds commit .* rebuild it with .*--force"):
        resolve_image(stale)
    with pytest.raises(ImageMissing, match="none of the 1 instances has its Docker image"):
        gym.make("crl/SWE-Bench-v0", instances=_save([ghost]), sandbox="docker")


def _save(instances) -> str:
    import tempfile

    from crl_envs.swe.instances import save_instances

    path = Path(tempfile.mkdtemp(prefix="crl-test-")) / "set.jsonl"
    return str(save_instances(instances, path))


@pytest.mark.docker
@pytest.mark.usefixtures("docker_images")
def test_a_root_filesystem_tarball_becomes_a_base_image(tmp_path):
    import shutil
    import tarfile

    from crl_envs.swe.images import LABEL, build_base

    tini = shutil.which("docker-init")  # a static binary: a root filesystem of one file (a real one is bigger)
    if tini is None:
        pytest.skip("docker-init (static tini) is not installed next to the engine")
    tar = tmp_path / "rootfs.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(os.path.realpath(tini), arcname="bin/init")
    name = "crl-test-base-from-tarball:latest"
    try:
        assert build_base(tar, name=name, force=True, log=lambda _m: None) == name
        assert image_labels(name)[LABEL] == "base"
        out = subprocess.run(["docker", "run", "--rm", "--network", "none", name, "/bin/init", "--version"],
                             capture_output=True, text=True, check=True).stdout
        assert out.startswith("tini version")
    finally:
        subprocess.run(["docker", "rmi", "-f", name], capture_output=True, check=False)


@pytest.mark.docker
@pytest.mark.usefixtures("docker_images")
def test_the_images_cli_reports_each_instances_image_and_names_bad_input(insts, capsys):
    from crl_envs.swe.images import main

    assert main(["status", "--bundled", "--ids", insts[0].instance_id]) == 0
    assert f"{insts[0].instance_id}: sweb.eval.x86_64.{insts[0].instance_id}:latest" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown instance ids: crl-mini__nope-1"):
        main(["status", "--bundled", "--ids", "crl-mini__nope-1"])
    assert main(["build", "--bundled", "--ids", insts[0].instance_id, "--rootfs", "/nonexistent/rootfs.tar"]) == 1
    assert "root filesystem tarball not found: /nonexistent/rootfs.tar" in capsys.readouterr().err


# --------------------------------------------------------------------------- episodes
@pytest.mark.docker
@pytest.mark.usefixtures("docker_images")
def test_one_container_serves_a_whole_episode_and_grading_uses_a_fresh_one(insts):
    owner = ds._owner()
    inst = insts[0]
    env = gym.make("crl/SWE-Mini-v0", sandbox="docker")
    env.reset(options={"instance_id": inst.instance_id})
    box = env.unwrapped._sandbox
    assert _containers(owner) == [_container_id(box.container)]
    env.step("echo kept > note.txt")
    # a file that would break the tests if grading reused this container (it is not part of the diff)
    obs, *_ = env.step("printf 'raise SystemExit(\"poisoned\")\\n' > conftest.py && echo conftest.py >> "
                       ".git/info/exclude && cat note.txt")
    assert "kept" in obs and env.unwrapped._sandbox is box and _containers(owner) == [_container_id(box.container)]
    reward, info, _ = _play_on(env, lambda e: e.unwrapped.oracle_action())
    assert reward == 1.0, info["grade"]
    volume = box.workspace
    env.close()
    assert _containers(owner) == [] and not volume.exists()  # container and its /testbed volume are gone


def _container_id(name: str) -> str:
    return subprocess.run(["docker", "inspect", "--format", "{{.Id}}", name], capture_output=True, text=True,
                          check=True).stdout.strip()[:12]


def _play_on(env, policy):
    for _ in range(50):
        obs, reward, term, trunc, info = env.step(policy(env))
        if term or trunc:
            return reward, info, obs
    raise AssertionError("episode did not end")


def _parity(instances):
    from tests.swe_support import require_bwrap

    runs = {}
    for kind in ("docker", "bwrap"):
        if kind == "bwrap":
            require_bwrap()
        env = gym.make("crl/SWE-Mini-v0", sandbox=kind)
        try:
            runs[kind] = [
                [_play(env, policy, {"instance_id": i.instance_id}) for i in instances]
                for policy in (lambda e: e.unwrapped.oracle_action(), lambda e: "submit")
            ]
        finally:
            env.close()
    oracle, empty = runs["docker"]
    assert [r for r, *_ in oracle] == [1.0] * len(instances)
    assert all(info["success"] and info["progress"] == 1.0 for _, info, _ in oracle)
    assert sum(r for r, *_ in empty) == 0 and not any(info["success"] for _, info, _ in empty)
    for got, want in zip(runs["docker"], runs["bwrap"], strict=True):  # the same transcripts
        for (r_d, info_d, obs_d), (r_b, info_b, obs_b) in zip(got, want, strict=True):
            assert r_d == r_b and info_d["grade"] == info_b["grade"]
            assert [o.replace("/testbed", "/workspace") for o in obs_d] == obs_b


@pytest.mark.docker
@pytest.mark.usefixtures("docker_images")
def test_docker_matches_bwrap_on_one_instance_per_library(insts):
    _parity([next(i for i in insts if i.repo == repo) for repo in sorted({i.repo for i in insts})])


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.usefixtures("docker_images")
def test_docker_oracle_resolves_every_bundled_instance_and_an_empty_agent_none_as_bwrap(insts):
    _parity(insts)


# --------------------------------------------------------------------------- failures
@pytest.mark.docker
@pytest.mark.usefixtures("docker_images")
def test_the_engine_vanishing_mid_episode_makes_the_step_an_error_naming_it(monkeypatch):
    env = gym.make("crl/SWE-Mini-v0", sandbox="docker")
    env.reset(seed=0)
    container = env.unwrapped._sandbox.container
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # as if dockerd died
    with pytest.raises(SandboxFailure, match=r"the Docker engine failed during the command: cannot connect to the Docker daemon"):
        env.step("ls")
    monkeypatch.delenv("DOCKER_HOST")
    env.reset(seed=0)  # a new episode gets a new container; the old one is removed
    assert env.unwrapped._sandbox.container != container
    assert not subprocess.run(["docker", "ps", "-aq", "--filter", f"name={container}"], capture_output=True,
                              text=True, check=True).stdout.strip()
    env.close()


@pytest.mark.docker
@pytest.mark.usefixtures("docker_images")
def test_a_killed_container_errors_the_pool_episode_and_the_slot_serves_the_next():
    from crl_envs.pool import EnvError, SyncEnvPool

    with SyncEnvPool([("crl/SWE-Mini-v0", {"sandbox": "docker"})], num_workers=1) as pool:
        pool.reset(0, seed=1)
        worker = pool.pool.worker_pids()[0]
        mine = [c for c in _containers() if _owner_pid(c) == worker]
        assert len(mine) == 1
        volume = subprocess.run(["docker", "inspect", "--format", "{{range .Mounts}}{{.Name}}{{end}}", mine[0]],
                                capture_output=True, text=True, check=True).stdout.strip()
        subprocess.run(["docker", "rm", "-f", mine[0]], capture_output=True, check=True)  # its volume stays
        with pytest.raises(EnvError, match=r"exception: SandboxFailure: .*(container|engine)") as e:
            pool.step(0, "ls")
        assert e.value.cause == "exception"
        pool.reset(0, seed=1)
        assert "README.md" in pool.step(0, "ls")[0]
    # the errored episode's volume went with its sandbox; nothing of the pool's is left
    assert subprocess.run(["docker", "volume", "inspect", volume], capture_output=True).returncode != 0
    assert not [c for c in _containers() if _owner_pid(c) == worker]


def _owner_pid(container: str) -> int:
    out = subprocess.run(["docker", "inspect", "--format", f'{{{{index .Config.Labels "{ds.OWNER_LABEL}"}}}}',
                          container], capture_output=True, text=True, check=True).stdout
    return int(out.split(":")[1])


@pytest.mark.docker
@pytest.mark.usefixtures("docker_images")
def test_leftovers_of_a_dead_run_are_removed_at_the_next_start():
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    made = []
    for owner in (f"{host}:{dead.pid}:1", ds._owner()):
        made.append(subprocess.run(["docker", "create", "--label", f"{ds.LABEL}=1", "--label",
                                    f"{ds.OWNER_LABEL}={owner}", BASE_IMAGE, "true"], capture_output=True, text=True,
                                   check=True).stdout.strip()[:12])
    try:
        removed = ds.reap_leftovers()
        assert made[0] in [r[:12] for r in removed] and made[1] not in [r[:12] for r in removed]
        assert made[1] in _containers(ds._owner())
    finally:
        subprocess.run(["docker", "rm", "-f", *made], capture_output=True, check=False)


# --------------------------------------------------------------------------- a fake engine (no Docker needed)
def _fake_docker(tmp_path: Path, monkeypatch, run_script: str) -> None:
    """A ``docker`` CLI that answers ``info`` and ``image inspect`` and does ``run_script`` for ``run``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text("#!/bin/bash\ncase \"$1\" in\n  info) echo 20.10;;\n  image) echo '{}';;\n  ps) ;;\n"
                      f"  run) {run_script};;\n  *) ;;\nesac\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    ds.docker_available.cache_clear()
    ds._reap_once.cache_clear()


@pytest.fixture
def fake_engine_cleanup():
    yield
    ds.docker_available.cache_clear()
    ds._reap_once.cache_clear()


def test_a_disk_full_engine_is_a_clear_error_not_a_hang(tmp_path, monkeypatch, fake_engine_cleanup):
    _fake_docker(tmp_path, monkeypatch, "echo 'docker: Error response from daemon: write /var/lib/docker/x: no space "
                                        "left on device.' >&2; exit 125")
    start = time.monotonic()
    with pytest.raises(SandboxFailure, match=r"could not start a container from img:1.*no space left on device"):
        ds.DockerSandbox("img:1")
    assert time.monotonic() - start < 10


def test_a_hung_engine_is_an_error_after_the_engine_timeout(tmp_path, monkeypatch, fake_engine_cleanup):
    _fake_docker(tmp_path, monkeypatch, "sleep 30")
    monkeypatch.setattr(ds, "ENGINE_TIMEOUT_S", 1.0)
    start = time.monotonic()
    with pytest.raises(SandboxFailure, match=r"did not answer `docker run` within 1 s"):
        ds.DockerSandbox("img:1")
    assert time.monotonic() - start < 8


def test_image_names_follow_swebench(insts):
    from swebench.image_builder.image_spec import ImageSpec

    inst = insts[0]
    assert instance_image_name(inst) == ImageSpec(inst.instance_id, "FROM x", None).name
    assert official_image_name(inst) == ImageSpec(inst.instance_id, "FROM x", "swebench").name
    django = replace(inst, instance_id="django__django-11099")
    assert official_image_name(django) == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"


def test_the_engine_stream_is_demultiplexed_and_bounded_across_split_frames():
    import struct

    from crl_envs.swe.docker_api import _dechunk, _Frames
    from crl_envs.swe.process import BoundedOutput

    out = BoundedOutput(64)
    frames = _Frames(out)
    stream = b"".join(struct.pack(">BxxxI", kind, len(data)) + data
                      for kind, data in ((1, b"hello "), (2, b"err\n"), (1, b"x" * 200)))
    for i in range(0, len(stream), 5):  # frames arrive cut at arbitrary points
        frames.feed(stream[i:i + 5])
    assert out.total == 210 and out.truncated and out.text().startswith("hello err\n")
    assert _dechunk(b"4\r\n{\"a\"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\n\r\n") == b'{"a": 1}'
