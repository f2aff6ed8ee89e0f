from __future__ import annotations

import gymnasium as gym

from crl_envs.spaces import UnicodeText


def test_unicode_text_accepts_spaces_and_unicode_but_bounds_length():
    space = UnicodeText(10)
    assert space.contains("a b ü 🚀")
    assert not space.contains("x" * 11)
    assert not space.contains(3)
    assert all(space.contains(space.sample()) for _ in range(20))


def test_invalid_action_is_a_noop_with_feedback():
    env = gym.make("test/Guess-v0")
    obs0, _ = env.reset(seed=3)
    obs, reward, term, trunc, info = env.step("banana")
    assert info["valid_action"] is False and reward == 0 and not term
    assert "Invalid action" in obs and obs0 in obs
    # repeated invalid moves do not grow the observation
    obs2, *_ = env.step("banana")
    assert obs2 == obs


def test_huge_action_is_rejected_cheaply():
    env = gym.make("test/Guess-v0")
    env.reset(seed=0)
    obs, reward, *_, info = env.step("9" * 5_000_000)
    assert not info["valid_action"] and "longer than" in obs


def test_step_after_episode_end_is_an_invalid_move_and_the_episode_stays_over():
    env = gym.make("test/Guess-v0")
    env.reset(seed=0)
    *_, term, trunc, info = env.step(env.unwrapped.oracle_action())
    assert term and not trunc and info["success"]
    for action in ("1", env.unwrapped.oracle_action(), 7):  # any action, even the winning one or a non-str
        obs, reward, term, trunc, info = env.step(action)
        assert not info["valid_action"] and "reset" in obs and reward == 0
        assert term and not trunc and info["success"]  # still over, as it ended: never live again
    obs, info = env.reset(seed=0)
    assert "reset" not in obs and not env.step("1")[2]  # reset starts a live episode
