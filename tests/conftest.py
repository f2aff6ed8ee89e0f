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


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random chat model (hidden 64, 2 layers) saved once per module: its folder, as a string."""
    from crl_agent.llm.tiny import build_tiny_chat_model

    return str(build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "tiny", seed=0))


@pytest.fixture
def one_thread():
    """One torch thread: the tiny model gains nothing from two, and on a shared machine loses a lot."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def no_child_processes():
    import multiprocessing

    yield
    assert not multiprocessing.active_children()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip, saying why, where torch sees no CUDA device (the vLLM CPU build is covered by
    the tests marked ``vllm``)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:
        skip = pytest.mark.skip(reason="needs a CUDA GPU: torch sees none here")
        for item in gpu:
            item.add_marker(skip)
