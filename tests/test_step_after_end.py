"""A step after an episode ended keeps it ended, in every family (``TextEnv.step``, inherited).

Gymnasium leaves stepping a finished env undefined; ours answers with an invalid move (feedback,
reward 0) that repeats how the episode ended, so ``terminated or truncated`` never turns false again.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

from crl_envs.registry import backend_installed

FAMILIES = {  # an id per family whose oracle wins within the cap
    "ALFWorld": "crl/ALFWorld-PickPlace-v0",
    "MiniHack": "crl/MiniHack-Room-5x5-v0",
    "Sokoban": "crl/Sokoban-6x6-2-v0",
    "WebShop": "crl/WebShop-v0",
}


def play_to_the_end(env: gym.Env, seed: int) -> tuple:
    env.reset(seed=seed)
    for _ in range(200):
        out = env.step(env.unwrapped.oracle_action())
        if out[2] or out[3]:
            return out
    raise AssertionError("the oracle did not end the episode in 200 steps")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_finished_episode_stays_finished_in_every_family(family):
    env_id = FAMILIES[family]
    if not backend_installed(env_id):
        pytest.skip(f"{env_id}: its backend is not installed")
    env = gym.make(env_id)
    try:
        last_obs, _, term, trunc, last_info = play_to_the_end(env, seed=1)
        assert term and not trunc and last_info["success"]
        for action in ("up", "look", "click[Buy Now]"):
            obs, reward, term, trunc, info = env.step(action)
            assert (term, trunc, reward, info["valid_action"]) == (True, False, 0.0, False), (action, obs)
            assert "reset" in obs and last_obs in obs  # feedback, then the final observation, unchanged
            assert info["success"] and info["progress"] == last_info["progress"]
        env.reset(seed=1)
        assert env.step(env.unwrapped.oracle_action())[4]["valid_action"]  # reset starts a live episode
    finally:
        env.close()


def test_truncation_by_the_time_limit_stays_truncated():
    env = gym.make("crl/Sokoban-6x6-2-v0", max_episode_steps=2)
    env.reset(seed=0)
    flags = [env.step("look")[2:4] for _ in range(4)]  # invalid moves, so the episode cannot be won meanwhile
    assert flags == [(False, False), (False, True), (False, True), (False, True)]


def test_an_episode_a_subclass_truncated_stays_truncated():
    """SWE grades at its own step limit and reports ``truncated``; later steps must not say ``terminated``."""
    from tests.swe_support import require_bwrap

    require_bwrap()
    env = gym.make("crl/SWE-Mini-v0", max_episode_steps=10, max_steps=1)  # SWE's limit, not the TimeLimit's
    try:
        env.reset(seed=3)
        *_, term, trunc, _ = env.step(env.unwrapped.oracle_action())
        assert trunc and not term
        for _ in range(2):
            obs, reward, term, trunc, info = env.step("ls")
            assert (term, trunc, reward, info["valid_action"]) == (False, True, 0.0, False) and "over" in obs
    finally:
        env.close()
