from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import pytest

import crl_envs
from crl_envs.registry import check_env_id, crl_env_ids
from crl_envs.testing import check_text_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_id_has_a_versioned_name_and_a_string_entry_point():
    ids = crl_env_ids()
    assert ids == sorted(ids) and ids
    for env_id in ids:
        spec = gym.spec(env_id)
        assert env_id.startswith("crl/") and spec.version is not None
        assert isinstance(spec.entry_point, str)
        assert spec.max_episode_steps
        spec.to_json()


def test_unknown_id_lists_close_matches():
    with pytest.raises(gym.error.NameNotFound, match="Did you mean: crl/Sokoban-6x6-2-v0"):
        check_env_id("crl/Sokoban-6x6-2-v1")
    with pytest.raises(gym.error.NameNotFound):
        crl_envs.make("nonsense")


def test_cli_lists_ids_with_family_version_steps_and_backend():
    out = subprocess.run(
        [sys.executable, "-m", "crl_envs", "list"], capture_output=True, text=True, cwd=REPO, check=True
    ).stdout
    assert "crl/Sokoban-6x6-2-v0" in out and "Sokoban" in out and "backend installed" in out


def test_cli_lists_a_plugin_registered_with_a_class_entry_point():
    from crl_envs.__main__ import _rows
    from tests.toy_envs import GuessEnv

    gym.register("myorg/ClassEntry-v3", entry_point=GuessEnv, max_episode_steps=7)
    try:
        rows = {r[0]: r for r in _rows()}
    finally:
        del gym.registry["myorg/ClassEntry-v3"]
    assert rows["myorg/ClassEntry-v3"][1:4] == ("plugin (tests.toy_envs)", "v3", "7")
    assert not any(k.startswith(("Reacher", "CartPole")) for k in rows)  # Gymnasium's own stay hidden


def test_cli_bad_flags_exit_2():
    proc = subprocess.run([sys.executable, "-m", "crl_envs", "nope"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "usage" in proc.stderr


PLUGIN = textwrap.dedent(
    '''
    import gymnasium as gym
    from crl_envs import TextEnv, StepOutcome, InvalidAction

    class EchoEnv(TextEnv):
        """Say the secret word."""

        def _reset_task(self, options):
            self.word = ["apple", "pear", "plum"][int(self.np_random.integers(3))]
            return f"The secret word is {self.word}.", {"task": "Say the secret word."}

        def _apply(self, action):
            if action != self.word:
                raise InvalidAction("that is not the secret word")
            return StepOutcome("Yes!", reward=1.0, terminated=True, success=True, progress=1.0)

        def _admissible_actions(self):
            return ["apple", "pear", "plum"]

    def register():
        gym.register("thirdparty/Echo-v0", entry_point="thirdparty_envs:EchoEnv", max_episode_steps=5)
    '''
)


def test_third_party_plugin_registers_through_entry_points_and_passes_the_kit(tmp_path):
    (tmp_path / "thirdparty_envs.py").write_text(PLUGIN)
    dist = tmp_path / "thirdparty_envs-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-envs\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[crl_envs.plugins]\necho = thirdparty_envs:register\n")
    script = textwrap.dedent(
        """
        import crl_envs, gymnasium as gym
        from crl_envs.testing import check_text_env
        assert "thirdparty/Echo-v0" in gym.registry
        print(check_text_env("thirdparty/Echo-v0").checks)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), REPO])}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "seeded determinism across fresh envs" in proc.stdout
    listing = subprocess.run(
        [sys.executable, "-m", "crl_envs", "list"], capture_output=True, text=True, env=env, cwd=tmp_path
    ).stdout
    assert "thirdparty/Echo-v0" in listing and "plugin (thirdparty_envs)" in listing


def test_broken_plugin_warns_instead_of_breaking_import(tmp_path):
    dist = tmp_path / "broken_envs-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-envs\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[crl_envs.plugins]\nbroken = no_such_module:register\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), REPO])}
    proc = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import crl_envs; print(len(crl_envs.crl_env_ids()))"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0 and "broken" in proc.stderr and int(proc.stdout) > 0


# Families whose own test module runs the kit on every id, with settings sized for that backend
# (test_every_family_runs_the_kit_on_each_of_its_ids checks that it does).
OWN_KIT_TESTS = {"MiniHack": "tests/test_minihack.py", "ALFWorld": "tests/test_alfworld.py",
                 "WebShop": "tests/test_webshop.py", "SWE": "tests/test_swe.py",
                 "Remote": "tests/test_openenv.py"}  # crl/Remote-v0 needs a server to play


def _kit_here(env_id: str) -> bool:
    from crl_envs.registry import family_of

    fam = family_of(env_id)
    return fam is None or fam.name not in OWN_KIT_TESTS


@pytest.mark.parametrize("env_id", [i for i in crl_env_ids() if _kit_here(i)])
def test_every_registered_env_passes_the_conformance_kit(env_id):
    from crl_envs.registry import backend_installed

    if not backend_installed(env_id):
        pytest.skip(f"{env_id}: backend not installed")
    check_text_env(env_id)


def test_every_family_runs_the_kit_on_each_of_its_ids():
    from crl_envs.registry import FAMILIES

    for name, path in OWN_KIT_TESTS.items():
        assert name in FAMILIES
        text = open(os.path.join(REPO, path), encoding="utf-8").read()
        assert "check_text_env" in text, f"{path} must run the conformance kit on every {name} id"


def test_the_readme_example_env_conforms_and_its_oracle_wins(tmp_path, monkeypatch):
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = readme.split("## Registering your own env", 1)[1]
    code = next(block for block in section.split("```python\n")[1:] if block.startswith("# my_package/envs.py"))
    pkg = tmp_path / "my_package"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "envs.py").write_text(code.split("```", 1)[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_package.envs import register  # noqa: PLC0415

    register()
    try:
        check_text_env("myorg/MyEnv-v0")
        env = gym.make("myorg/MyEnv-v0")
        obs, info = env.reset(seed=3)
        obs, reward, terminated, _, info = env.step(env.unwrapped.oracle_action())
        assert terminated and reward == 1.0 and info["success"]
    finally:
        del gym.registry["myorg/MyEnv-v0"]


def test_env_class_reads_the_class_without_building_an_env(monkeypatch):
    from crl_envs.registry import env_class, has_solver
    from crl_envs.sokoban.env import SokobanEnv
    from tests.toy_envs import GuessEnv, RaisingEnv

    monkeypatch.setattr(gym, "make", lambda *a, **k: pytest.fail("env_class built an env for a class entry point"))
    assert env_class("crl/Sokoban-6x6-2-v0") is SokobanEnv and has_solver("crl/Sokoban-6x6-2-v0")
    assert env_class("test/Guess-v0") is GuessEnv and has_solver("test/Guess-v0")
    assert env_class("test/GuessRaising-v0") is RaisingEnv
    with pytest.raises(gym.error.NameNotFound, match="Did you mean"):
        env_class("crl/Sokoban-6x6-2-v9")


def test_has_solver_is_false_where_oracle_action_is_not_overridden_and_factories_are_built_once():
    from crl_envs.core import TextEnv
    from crl_envs.registry import env_class, has_solver
    from tests.toy_envs import GuessEnv

    class NoSolver(GuessEnv):
        oracle_action = TextEnv.oracle_action

    built = []

    def factory(**kwargs):
        built.append(kwargs)
        return NoSolver()

    gym.register("myorg/NoSolver-v0", entry_point=NoSolver, max_episode_steps=5)
    gym.register("myorg/Factory-v0", entry_point=factory, max_episode_steps=5)
    try:
        assert not has_solver("myorg/NoSolver-v0")
        assert env_class("myorg/Factory-v0") is NoSolver and len(built) == 1
    finally:
        del gym.registry["myorg/NoSolver-v0"], gym.registry["myorg/Factory-v0"]


def test_an_unknown_id_in_a_known_family_is_unknown_with_close_matches():
    with pytest.raises(gym.error.NameNotFound, match="Unknown env id 'crl/Sokoban-99x99-1-v0'.*Did you mean"):
        check_env_id("crl/Sokoban-99x99-1-v0")
