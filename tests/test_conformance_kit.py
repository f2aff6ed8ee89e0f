from __future__ import annotations

import pytest

from crl_envs.testing import ConformanceError, check_text_env


def test_kit_passes_a_correct_env():
    report = check_text_env("test/Guess-v0")
    assert "seeded determinism across fresh envs" in report.checks
    assert "truncation at max_episode_steps" in report.checks
    assert "gymnasium check_env" in report.checks


@pytest.mark.parametrize(
    ("env_id", "rule"),
    [
        ("test/GuessRaising-v0", "step"),
        ("test/GuessNondet-v0", "reuse"),
        ("test/GuessLeaky-v0", "reuse"),
        ("test/GuessNoFeedback-v0", "invalid"),
    ],
)
def test_kit_catches_a_broken_env(env_id, rule):
    with pytest.raises(ConformanceError, match=rf"\[{rule}\]"):
        check_text_env(env_id)


def test_kit_accepts_a_factory_and_an_instance():
    from tests.toy_envs import GuessEnv

    assert "spaces" in check_text_env(GuessEnv, check_truncation=False).checks
    assert "spaces" in check_text_env(GuessEnv(), check_truncation=False).checks


def test_kit_flags_single_instance_envs_unless_told():
    import gymnasium as gym

    from tests.toy_envs import GuessEnv

    class OneTask(GuessEnv):
        def _reset_task(self, options):
            self.target, self.history = 5, []
            return "Guess a number from 1 to 9.", {"task": "Guess the hidden number."}

    if "test/OneTask-v0" not in gym.registry:
        gym.register("test/OneTask-v0", entry_point=OneTask, max_episode_steps=12)
    with pytest.raises(ConformanceError, match=r"\[seeds\]"):
        check_text_env(lambda: OneTask())
    check_text_env(lambda: OneTask(), single_instance=True)
