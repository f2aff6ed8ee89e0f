from __future__ import annotations

import gymnasium as gym
import pytest

import crl_envs  # noqa: F401 - registers crl/* ids

TOY_IDS = {
    "test/Guess-v0": "tests.toy_envs:GuessEnv",
    "test/GuessRaising-v0": "tests.toy_envs:RaisingEnv",
    "test/GuessNondet-v0": "tests.toy_envs:NondeterministicEnv",
    "test/GuessLeaky-v0": "tests.toy_envs:LeakyEnv",
    "test/GuessNoFeedback-v0": "tests.toy_envs:NoFeedbackEnv",
    "test/Faulty-v0": "tests.toy_envs:FaultyEnv",
}
for _id, _ep in TOY_IDS.items():
    if _id not in gym.registry:
        gym.register(_id, entry_point=_ep, max_episode_steps=12)


@pytest.fixture
def no_child_processes():
    import multiprocessing

    yield
    assert not multiprocessing.active_children()
