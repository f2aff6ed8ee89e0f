"""verifiers' own evaluation loop plays crl-bench envs through :mod:`crl_envs.integrations.verifiers`.

The model is a tiny random Llama served by our OpenAI-compatible ``crl_agent.serve`` on loopback;
verifiers reaches it through its OpenAI chat client. verifiers pins ``mcp<2`` (the openenv extra needs
mcp>=2.3), so these tests run in ``.venv-verifiers`` (``make test-verifiers``) and skip elsewhere.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

pytest.importorskip("verifiers", reason="needs verifiers: pip install -e '.[verifiers]' (`make test-verifiers`)")
pytest.importorskip("torch", reason="the served model needs torch: pip install -e '.[agent]'")

from openai import AsyncOpenAI  # noqa: E402
from verifiers.clients import OpenAIChatCompletionsClient  # noqa: E402

import crl_envs  # noqa: E402, F401  (registers the ids)
from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402
from crl_agent.serve import ChatServer  # noqa: E402
from crl_envs.integrations.verifiers import (  # noqa: E402
    TextGymEnv,
    load_environment,
    tagged_action,
)

pytestmark = pytest.mark.verifiers
SOKOBAN = "crl/Sokoban-6x6-1-v0"
SAMPLING = {"max_tokens": 8, "temperature": 1.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    srv = ChatServer(TransformersLLM(model_dir, batch_wait_ms=20), port=0).start()
    yield srv
    srv.close()


def client_for(server) -> OpenAIChatCompletionsClient:
    return OpenAIChatCompletionsClient(AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0))


def texts(messages, role):
    return [m["content"] for m in messages if m["role"] == role]


def test_evaluate_replays_our_env_step_for_step(server):
    """Each env message in verifiers' transcript is what our step returns for the model's reply."""
    env = load_environment(SOKOBAN, num_eval_examples=2, make_kwargs={"max_episode_steps": 3})
    out = env.evaluate_sync(client_for(server), server.model_name, sampling_args=SAMPLING,
                            num_examples=2, rollouts_per_example=2, max_concurrent=4)
    rows = out["outputs"]
    assert len(rows) == 4
    for row in rows:
        assert row.get("error") is None, row.get("error")
        seed = row["info"]["seed"]
        ref = gym.make(SOKOBAN, max_episode_steps=3)
        first, _ = ref.reset(seed=seed)
        assert texts(row["prompt"], "user") == [first]  # the placeholder gave way to the first observation
        replies, answers = texts(row["completion"], "assistant"), texts(row["completion"], "user")
        assert len(replies) == len(answers) == 3  # truncated by the env's own bound: the last reply is played
        total = 0.0
        for reply, answer in zip(replies, answers, strict=True):
            obs, reward, *_ = ref.step(tagged_action(reply))
            assert answer == obs
            total += reward
        ref.close()
        assert row["reward"] == pytest.approx(total)
        assert row["metrics"]["steps"] == 3
        assert row["stop_condition"] == "has_final_env_response"
    assert {r["info"]["seed"] for r in rows} == {1_000_000, 1_000_001}


def test_solved_episode_is_rewarded_by_the_rubric(server):
    """Actions from the solver (the replies are ignored): the reward is the env's return and success is 1."""
    seed = 5
    ref = gym.make(SOKOBAN)
    ref.reset(seed=seed)
    plan, done, expected = [], False, 0.0
    while not done:
        plan.append(ref.unwrapped.oracle_action())
        _, reward, terminated, truncated, _ = ref.step(plan[-1])
        expected, done = expected + reward, terminated or truncated
    ref.close()
    actions = iter(plan)
    env = TextGymEnv(SOKOBAN, eval_seeds=[seed], parse_action=lambda reply, admissible: next(actions))
    out = env.evaluate_sync(client_for(server), server.model_name, sampling_args=SAMPLING, num_examples=1)
    (row,) = out["outputs"]
    assert row["metrics"]["success"] == 1.0 and row["metrics"]["progress"] == 1.0
    assert row["metrics"]["steps"] == len(plan) and row["metrics"]["invalid_actions"] == 0
    assert row["reward"] == pytest.approx(expected) and expected > 0
    assert out["metadata"]["avg_reward"] == pytest.approx(expected)


def test_tagged_action_takes_the_last_tag_else_the_reply():
    assert tagged_action("think <action>up</action> no, <action> left </action>") == "left"
    assert tagged_action("  down \n") == "down"
    assert tagged_action("<action></action> right") == "<action></action> right"


def test_bad_arguments_fail_clearly():
    with pytest.raises(gym.error.NameNotFound, match="Unknown env id"):
        TextGymEnv("crl/NoSuch-v0", eval_seeds=[0])
    with pytest.raises(ValueError, match="both are empty"):
        TextGymEnv(SOKOBAN)
    with pytest.raises(ValueError, match="non-negative ints"):
        TextGymEnv(SOKOBAN, eval_seeds=[-1])
    with pytest.raises(ValueError, match=">= 0"):
        load_environment(SOKOBAN, num_eval_examples=-2)
