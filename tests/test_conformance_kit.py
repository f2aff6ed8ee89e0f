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


class _PlainTextEnv:
    """A plain Gymnasium text env (not a TextEnv), as third parties write them."""

    @staticmethod
    def make(space: str = "unicode", progress_type: type = float, echo: bool = False):
        import gymnasium as gym

        from crl_envs import UnicodeText

        class Plain(gym.Env):
            metadata = {"render_modes": ["ansi"]}

            def __init__(self, render_mode=None):
                self.render_mode = render_mode
                self.observation_space = gym.spaces.Text(10_000) if space == "text" else UnicodeText(10_000)
                self.action_space = UnicodeText(10_000)
                self.target = 0

            def _info(self, valid=True, success=False):
                return {"task": f"say {self.target}", "admissible_actions": None, "valid_action": valid,
                        "success": success, "progress": progress_type(success)}

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.target = int(self.np_random.integers(100))
                return f"Say the number {self.target}.", self._info()

            def step(self, action):
                valid = action.strip().isdigit()
                success = valid and int(action) == self.target
                reply = "Yes." if success else f"No, {action!s:.40} is not a number." if echo else "No, say a number."
                return reply, float(success), success, False, self._info(valid, success)

            def render(self):
                return "Say a number."

        return Plain


def test_a_plain_gymnasium_env_with_unicode_spaces_and_numpy_progress_conforms():
    import numpy as np

    check_text_env(_PlainTextEnv.make(progress_type=np.float32))


def test_an_observation_echoing_a_lone_surrogate_fails_as_not_valid_unicode():
    with pytest.raises(ConformanceError, match=r"\[step\] after action '\\ud800 north'.*not valid Unicode"):
        check_text_env(_PlainTextEnv.make(echo=True))


def test_a_restricted_text_space_fails_naming_the_fix():
    with pytest.raises(ConformanceError, match=r"\[spaces\] observation_space Text.*use crl_envs.UnicodeText"):
        check_text_env(_PlainTextEnv.make(space="text"))


def test_an_id_registered_without_a_step_limit_fails_naming_the_fix():
    import gymnasium as gym

    if "test/GuessNoLimit-v0" not in gym.registry:
        gym.register("test/GuessNoLimit-v0", entry_point="tests.toy_envs:GuessEnv")
    with pytest.raises(ConformanceError, match=r"\[truncation\] .*without max_episode_steps.*max_episode_steps=N"):
        check_text_env("test/GuessNoLimit-v0")
    assert "truncation at max_episode_steps" not in check_text_env("test/GuessNoLimit-v0", check_truncation=False).checks
