"""SWE envs: the bundled set, instance files, repositories, grading, the env, the oracle and the kit."""

from __future__ import annotations

import json
import subprocess
import warnings
from dataclasses import replace

import gymnasium as gym
import pytest

import crl_envs  # noqa: F401
from crl_envs.testing import check_text_env
from tests.swe_support import skip_module_without_bwrap  # noqa: E402

skip_module_without_bwrap()

from crl_envs.swe import sandbox as sandbox_mod  # noqa: E402
from crl_envs.swe.bundled import bundled_instances, bundled_repos_dir  # noqa: E402
from crl_envs.swe.grading import build_test_spec, grade_patch  # noqa: E402
from crl_envs.swe.instances import (  # noqa: E402
    InstanceFileError,
    checkout,
    find_repo_source,
    load_instances,
    save_instances,
)


@pytest.fixture(scope="module")
def insts():
    return bundled_instances()


def _inst(insts, instance_id):
    return next(i for i in insts if i.instance_id == instance_id)


def _play(env, policy, seed=None, options=None):
    obs, info = env.reset(seed=seed, options=options)
    for _ in range(200):
        obs, reward, term, trunc, info = env.step(policy(env))
        if term or trunc:
            return obs, reward, term, trunc, info
    raise AssertionError("episode did not end")


# --------------------------------------------------------------------------- bundled set
def test_bundled_set_has_real_git_history_across_three_libraries(insts, tmp_path):
    assert len(insts) >= 12 and len({i.repo for i in insts}) >= 3
    assert len({i.instance_id for i in insts}) == len(insts)
    for inst in insts:
        repo = checkout(find_repo_source(inst, bundled_repos_dir()), inst.base_commit, tmp_path / inst.instance_id)
        log = subprocess.run(["git", "log", "--all", "--format=%H %s"], cwd=repo, capture_output=True, text=True).stdout
        # only the instance's own history: the fix is in no commit the agent can see
        assert log.splitlines()[0].startswith(inst.base_commit) and len(log.splitlines()) == 2
        assert inst.FAIL_TO_PASS and inst.PASS_TO_PASS and inst.problem_statement.strip()
        assert subprocess.run(["git", "apply", "--check", "-"], input=inst.patch, text=True, cwd=repo).returncode == 0
        assert subprocess.run(["git", "apply", "--check", "-"], input=inst.test_patch, text=True, cwd=repo).returncode == 0
        assert all(t.split("::")[0] in inst.test_files for t in inst.FAIL_TO_PASS)


def test_bundled_commit_shas_are_the_same_on_every_build(insts, tmp_path, monkeypatch):
    monkeypatch.setenv("CRL_SWE_CACHE", str(tmp_path))
    again = bundled_instances()
    assert [i.base_commit for i in again] == [i.base_commit for i in insts]
    assert [i.patch for i in again] == [i.patch for i in insts]


# --------------------------------------------------------------------------- instance files
def test_instance_files_round_trip_as_json_jsonl_and_parquet(insts, tmp_path):
    for suffix in (".json", ".jsonl", ".parquet"):
        path = save_instances(insts[:3], tmp_path / f"set{suffix}")
        assert load_instances(path) == insts[:3]
    rec = json.loads((tmp_path / "set.jsonl").read_text().splitlines()[0])
    assert isinstance(rec["FAIL_TO_PASS"], str)  # JSON-encoded, as in the published datasets


def test_classic_and_swebench5_instance_forms_both_load_and_make_test_specs(insts, tmp_path):
    from swebench.types import SWEbenchInstance

    classic = {k: v for k, v in insts[0].to_record().items() if k in SWEbenchInstance.__annotations__}
    classic["FAIL_TO_PASS"] = json.loads(classic["FAIL_TO_PASS"])  # lists are accepted too
    assert set(classic) == set(SWEbenchInstance.__annotations__)
    modern = {**classic, "instance_id": "crl-mini__x-1", "image": "swebench/sweb.eval.x86_64.x:latest",
              "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail",
              "eval_script": "#!/bin/bash\nset -uxo pipefail\ncd /testbed\n: '>>>>> Start Test Output'\n"
                             "echo '>>>>> Start Test Output'\npytest -rA\necho '>>>>> End Test Output'\n"}
    (tmp_path / "mixed.json").write_text(json.dumps([classic, modern]))
    a, b = load_instances(tmp_path / "mixed.json")
    assert a.FAIL_TO_PASS == insts[0].FAIL_TO_PASS and a.parser_name == "parse_log_pytest"
    spec_a = build_test_spec(a)
    assert spec_a.FAIL_TO_PASS == list(a.FAIL_TO_PASS) and ">>>>> Test Exit Code" in spec_a.eval_script
    spec_b = build_test_spec(b, instance_script=True)  # swebench.harness.utils.make_test_spec
    assert spec_b.image == modern["image"] and "pytest -rA" in spec_b.eval_script


@pytest.mark.parametrize(
    ("content", "suffix", "match"),
    [
        ('[{"instance_id": "a__b-1"}]', ".json", r"\[0\] \(instance_id='a__b-1'\): missing required field 'repo'"),
        ("FIELDS", ".jsonl", r":1 \(instance_id='x__y-1'\): field 'FAIL_TO_PASS' must be a list"),
        ("{not json\n", ".jsonl", r":1: not valid JSON"),
        ('[{"instance_id": 3}]', ".json", r"missing required field 'repo'"),
        ("BADSHA", ".json", r"field 'base_commit' must be a git commit sha"),
        ("", ".jsonl", r"holds no instances"),
        ("[]", ".yaml", r"unknown instance file type '.yaml'"),
    ],
)
def test_malformed_instance_files_name_the_file_and_field(insts, tmp_path, content, suffix, match):
    good = insts[0].to_record()
    if content == "FIELDS":
        content = json.dumps({**good, "instance_id": "x__y-1", "FAIL_TO_PASS": {"a": 1}}) + "\n"
    elif content == "BADSHA":
        content = json.dumps([{**good, "base_commit": "not-a-sha"}])
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    with pytest.raises(InstanceFileError, match=match) as err:
        load_instances(path)
    assert str(path) in str(err.value)


def test_test_commands_parsers_images_and_layouts_for_real_repos(insts):
    from crl_envs.swe.docker_sandbox import instance_image
    from crl_envs.swe.env import render_layout

    patch = "diff --git a/tests/m/test_x.py b/tests/m/test_x.py\n--- a/tests/m/test_x.py\n+++ b/tests/m/test_x.py\n"
    django = replace(insts[0], instance_id="django__django-11099", repo="django/django", test_patch=patch,
                     test_cmd="", log_parser="")
    assert django.test_command().startswith("./tests/runtests.py") and django.test_command().endswith(" m.test_x")
    assert django.parser_name == "parse_log_django"
    assert instance_image(django) == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    flask = replace(django, repo="pallets/flask")
    assert flask.test_command() == "python -m pytest -rA -p no:cacheprovider tests/m/test_x.py"
    paths = [f"pkg{i % 7}/sub{i % 3}/mod{i}.py" for i in range(500)]
    layout = render_layout(paths, "a" * 40)
    assert "(500 tracked files)" in layout and "pkg0/sub0/  (" in layout and len(layout.splitlines()) <= 61


def test_repositories_resolve_from_bundles_and_mirrors_with_a_clear_error_otherwise(insts, tmp_path):
    inst = insts[0]
    src = find_repo_source(inst, bundled_repos_dir())
    slug = inst.repo.replace("/", "__")
    subprocess.run(["git", "bundle", "create", str(tmp_path / f"{slug}.bundle"), "--all"], cwd=src,
                   capture_output=True, check=True)
    bundle = find_repo_source(inst, tmp_path)
    assert bundle.suffix == ".bundle"
    repo = checkout(bundle, inst.base_commit, tmp_path / "ws")
    assert (repo / "README.md").is_file()
    subprocess.run(["git", "clone", "-q", "--mirror", str(src), str(tmp_path / "m" / f"{slug}.git")], check=True)
    assert find_repo_source(inst, tmp_path / "m").name == f"{slug}.git"
    with pytest.raises(RuntimeError, match=r"commit 0+ is not in the repository"):
        checkout(src, "0" * 40, tmp_path / "ws2")
    with pytest.raises(FileNotFoundError, match=r"SWE_REPOS/crl-mini__tinysemver"):
        find_repo_source(replace(inst, repo_path=""), tmp_path / "nowhere")


# --------------------------------------------------------------------------- grading
def test_progress_counts_fail_to_pass_only_while_pass_to_pass_holds(insts):
    inst = _inst(insts, "crl-mini__tinysemver-26")
    src = find_repo_source(inst, bundled_repos_dir())
    half = inst.patch.replace("+    return Version(0, 0, v.patch + 1)\n", "+    return Version(0, 1, 0)\n")
    assert half != inst.patch
    g = grade_patch(inst, half, source=src)
    assert g.patch_applied and not g.resolved and g.progress == 0.5 and not g.p2p_failed
    breaking = inst.patch + (
        "--- a/tests/test_semver.py\n+++ b/tests/test_semver.py\n"  # editing tests is undone before grading
        "@@ -1,1 +1,1 @@\n-import pytest\n+import pytest  # edited\n"
    )
    g2 = grade_patch(inst, breaking.replace("+        return Version(v.major + 1, 0, 0)\n",
                                            "+        return Version(v.major + 2, 0, 0)\n"), source=src)
    assert g2.patch_applied and g2.p2p_failed and g2.progress == 0.0 and not g2.resolved
    g3 = grade_patch(inst, "this is not a diff\n", source=src)
    assert not g3.patch_applied and not g3.resolved and g3.progress == 0.0


# --------------------------------------------------------------------------- the env
def _oracle_and_empty_agent(instances):
    env = gym.make("crl/SWE-Mini-v0")
    try:
        oracle = [_play(env, lambda e: e.unwrapped.oracle_action(), options={"instance_id": i.instance_id})
                  for i in instances]
        empty = [_play(env, lambda e: "submit", options={"instance_id": i.instance_id}) for i in instances]
    finally:
        env.close()
    return oracle, empty


def test_oracle_resolves_one_instance_per_library_and_an_empty_agent_none(insts):
    one_each = [next(i for i in insts if i.repo == repo) for repo in sorted({i.repo for i in insts})]
    oracle, empty = _oracle_and_empty_agent(one_each)
    assert [r for _, r, *_ in oracle] == [1.0] * len(one_each)
    assert all(info["success"] and info["progress"] == 1.0 and info["model_patch"] for *_, info in oracle)
    assert sum(r for _, r, *_ in empty) == 0 and not any(info["success"] for *_, info in empty)
    assert "the patch is empty" in empty[0][0]


@pytest.mark.slow
def test_every_bundled_instance_fails_before_the_fix_and_the_oracle_resolves_it(insts):
    for inst in insts:
        name = inst.repo.split("/")[1]
        noop = f"--- a/README.md\n+++ b/README.md\n@@ -1,1 +1,1 @@\n-# {name}\n+# {name} (docs)\n"
        before = grade_patch(inst, noop, source=find_repo_source(inst, bundled_repos_dir()))
        assert before.patch_applied and not before.f2p_passed and not before.p2p_failed, inst.instance_id
        assert before.progress == 0.0 and len(before.p2p_passed) == len(inst.PASS_TO_PASS)
    oracle, empty = _oracle_and_empty_agent(insts)
    assert [r for _, r, *_ in oracle] == [1.0] * len(insts)  # 100% resolved
    assert sum(r for _, r, *_ in empty) == 0  # 0% resolved


def test_seed_picks_the_instance(insts):
    env = gym.make("crl/SWE-Mini-v0")
    seen = {env.reset(seed=s)[1]["instance_id"] for s in range(20)}
    env.close()
    assert len(seen) >= 6 and seen <= {i.instance_id for i in insts}


def test_observation_holds_issue_layout_and_last_command_output():
    env = gym.make("crl/SWE-Mini-v0")
    obs, info = env.reset(seed=0)
    assert info["task"].splitlines()[0] in obs and "README.md" in obs and "tests/" in obs
    obs, reward, term, trunc, info = env.step("echo hello && ls tests && exit 3")
    assert "$ echo hello" in obs and "hello\n" in obs and "[exit code 3]" in obs and info["valid_action"]
    assert "(step 1/30)" in obs
    assert info["task"].splitlines()[0] in obs and not term
    env.close()


def test_megabytes_and_binary_output_are_truncated_and_decoded_safely():
    env = gym.make("crl/SWE-Mini-v0")
    env.reset(seed=0)
    obs, *_ = env.step("yes 0123456789 | head -c 20000000")
    assert "bytes of output truncated" in obs and len(obs) < 40000
    obs, *_, info = env.step("head -c 4000 /dev/urandom; printf '\\x00\\xff\\x1b[2J done'")
    assert info["valid_action"] and "\x00" not in obs and "\x1b" not in obs and "\ufffd" in obs and "done" in obs
    env.close()


def test_never_ending_command_times_out_with_a_message():
    env = gym.make("crl/SWE-Mini-v0", command_timeout_s=1.5)
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step("sleep 60")
    assert "wall-clock timeout of 1.5 s" in obs and info["timed_out"] and not term
    obs, *_ = env.step("echo still alive")
    assert "still alive" in obs
    env.close()


def test_the_env_declares_how_long_a_submit_step_may_take():
    env = gym.make("crl/SWE-Mini-v0", command_timeout_s=90, grade_timeout_s=600)
    assert env.unwrapped.step_time_limit_s >= 600 + 90  # eval.run's pool timeout stays above it
    env.close()


def test_nul_bytes_and_empty_commands_are_invalid_moves():
    env = gym.make("crl/SWE-Mini-v0")
    env.reset(seed=0)
    for action in ["echo a\x00b", "   "]:
        obs, reward, term, trunc, info = env.step(action)
        assert not info["valid_action"] and reward == 0 and "Invalid action" in obs
    env.close()


def test_step_limit_grades_the_current_diff():
    env = gym.make("crl/SWE-Mini-v0", max_episode_steps=1, max_steps=1)  # the oracle applies the patch in step 1
    obs, reward, term, trunc, info = _play(env, lambda e: e.unwrapped.oracle_action(), seed=3)
    assert trunc and not term and reward == 1.0 and info["success"] and "step limit reached" in obs
    obs, reward, *_, info = env.step("ls")
    assert reward == 0 and not info["valid_action"] and "episode is over" in obs
    env.close()


def test_swe_bench_needs_an_instance_file(monkeypatch):
    monkeypatch.delenv("SWE_INSTANCES", raising=False)
    with pytest.raises(ValueError, match=r"instances=.*SWE_INSTANCES"):
        gym.make("crl/SWE-Bench-v0")


def test_swe_bench_runs_real_instance_files_with_repos_dir(insts, tmp_path, monkeypatch):
    path = save_instances(insts[5:7], tmp_path / "lite.parquet")
    monkeypatch.setenv("SWE_INSTANCES", str(path))
    monkeypatch.setenv("SWE_REPOS", str(bundled_repos_dir()))
    env = gym.make("crl/SWE-Bench-v0")
    obs, reward, *_, info = _play(env, lambda e: e.unwrapped.oracle_action(), seed=0)
    assert reward == 1.0 and info["instance_id"] in {i.instance_id for i in insts[5:7]}
    env.close()


def test_swe_bench_without_repositories_fails_at_make_and_warns_when_some_are_missing(insts, tmp_path, monkeypatch):
    path = save_instances([replace(i, repo_path="") for i in insts[:2]], tmp_path / "lite.jsonl")
    monkeypatch.delenv("SWE_REPOS", raising=False)
    with pytest.raises(FileNotFoundError, match=r"none of the 2 instances has its repository.*\$SWE_REPOS/"):
        gym.make("crl/SWE-Bench-v0", instances=str(path), repos_dir=str(tmp_path / "nowhere"))
    partial = tmp_path / "partial"
    partial.mkdir()
    slug = insts[0].repo.replace("/", "__")
    (partial / slug).symlink_to(bundled_repos_dir() / slug)
    others = [i for i in insts if i.repo != insts[0].repo][:1]
    path = save_instances([replace(i, repo_path="") for i in [insts[0], *others]], tmp_path / "mixed.jsonl")
    with pytest.warns(UserWarning, match=r"1 of 2 instances have no repository on disk"):
        gym.make("crl/SWE-Bench-v0", instances=str(path), repos_dir=str(partial)).close()


def test_default_sandbox_without_bubblewrap_names_the_fix(monkeypatch):
    monkeypatch.setattr(sandbox_mod.shutil, "which", lambda name: None)
    sandbox_mod.bwrap_mode.cache_clear()
    try:
        with pytest.raises(sandbox_mod.SandboxUnavailable, match="apt-get install bubblewrap"):
            gym.make("crl/SWE-Mini-v0")
    finally:
        sandbox_mod.bwrap_mode.cache_clear()


def test_local_sandbox_is_opt_in_and_warns_loudly():
    with pytest.warns(RuntimeWarning, match="NO isolation"):
        env = gym.make("crl/SWE-Mini-v0", sandbox="local")
        env.reset(seed=1)
    obs, *_ = env.step("echo local works")
    assert "local works" in obs
    env.close()


def test_docker_sandbox_without_an_engine_is_a_clear_error(insts):
    from crl_envs.swe.docker_sandbox import DockerSandbox, docker_available

    if not docker_available():
        pytest.skip("a Docker engine runs here")
    with pytest.raises(sandbox_mod.SandboxUnavailable, match="sandbox='bwrap'"):
        DockerSandbox(insts[0])


@pytest.mark.docker
def test_docker_sandbox_grades_a_real_instance_with_its_harness_image():
    import os

    if not os.environ.get("SWE_DOCKER_INSTANCES"):  # checked first: no engine is started for nothing
        pytest.skip("set SWE_DOCKER_INSTANCES to an instance file whose SWE-bench harness images are built")
    from crl_envs.swe.docker_sandbox import docker_available

    reason = docker_available()
    if reason:
        pytest.skip(f"docker: {reason}")
    inst = load_instances(os.environ["SWE_DOCKER_INSTANCES"])[0]
    assert grade_patch(inst, inst.patch, source=None, sandbox="docker").resolved


# --------------------------------------------------------------------------- conformance kit
@pytest.mark.parametrize("env_id", ["crl/SWE-Bench-v0", "crl/SWE-Mini-v0"])
def test_swe_ids_pass_the_conformance_kit(env_id, insts, tmp_path):
    kwargs = {}
    if env_id == "crl/SWE-Bench-v0":
        path = save_instances(insts[:4], tmp_path / "set.jsonl")
        kwargs = {"instances": str(path), "repos_dir": str(bundled_repos_dir())}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_text_env(env_id, seeds=(0, 1), n_steps=4, make_kwargs=kwargs)
