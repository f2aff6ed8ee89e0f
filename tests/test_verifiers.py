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
    openai_client,
    tagged_action,
)
from crl_envs.remote import RemoteEnvError  # noqa: E402
from tests.toy_envs import GuessEnv  # noqa: E402

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


def test_a_plain_async_openai_client_is_accepted(server):
    """What verifiers' users pass: ``openai.AsyncOpenAI`` itself (verifiers 0.3.1 alone refuses it)."""
    env = load_environment(SOKOBAN, num_eval_examples=1, make_kwargs={"max_episode_steps": 2})
    for client in (AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0), openai_client(server.url)):
        out = env.evaluate_sync(client, server.model_name, sampling_args=SAMPLING, num_examples=1)
        (row,) = out["outputs"]
        assert row.get("error") is None and row["metrics"]["steps"] == 2


def test_a_sync_openai_client_is_refused_with_the_fix():
    from openai import OpenAI

    env = load_environment(SOKOBAN, num_eval_examples=1)
    with pytest.raises(TypeError, match="AsyncOpenAI"):
        env.evaluate_sync(OpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused"), "m", num_examples=1)


class CutShortEnv(GuessEnv):
    """A served env's client as the server fails it: ``down`` loses the connection; seed 7 is refused at reset."""

    def reset(self, *, seed=None, options=None):
        if seed == 7:
            raise RemoteEnvError("CAPACITY_REACHED: Server at capacity", code="CAPACITY_REACHED")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.history:
            raise RemoteEnvError("http://x closed the session", code="CONNECTION_LOST")
        if action == "raise":
            raise RemoteEnvError("EXECUTION_ERROR: env bug", code="EXECUTION_ERROR", session_ended=False)
        return super().step(action)


@pytest.fixture(scope="module")
def cut_short_id():
    env_id = "test/CutShort-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=f"{__name__}:CutShortEnv", max_episode_steps=12)
    return env_id


@pytest.mark.parametrize("seed", [3, 7])
def test_an_episode_the_server_cut_short_is_marked_and_errors_the_row(server, cut_short_id, seed):
    """Lost mid-episode (seed 3: the second step) or refused at reset (seed 7): the row carries verifiers'
    ``error`` (an infrastructure failure) and ``cut_short`` = 1."""
    env = TextGymEnv(cut_short_id, eval_seeds=[seed], parse_action=lambda reply, admissible: "1")
    out = env.evaluate_sync(client_for(server), server.model_name, sampling_args=SAMPLING, num_examples=1)
    (row,) = out["outputs"]
    code = "CAPACITY_REACHED" if seed == 7 else "CONNECTION_LOST"
    assert row["metrics"]["cut_short"] == 1.0
    assert row["error"] is not None and "cut short" in str(row["error"]) and code in str(row["error"])
    assert row["metrics"]["steps"] == (0 if seed == 7 else 1)


def test_an_env_error_that_keeps_the_session_is_raised_not_hidden_as_cut_short(server, cut_short_id):
    """The served env raised on an action (a bug in the env): it is not the server cutting the episode short."""
    env = TextGymEnv(cut_short_id, eval_seeds=[3], parse_action=lambda reply, admissible: "raise")
    with pytest.raises(RemoteEnvError, match="EXECUTION_ERROR"):
        env.evaluate_sync(client_for(server), server.model_name, sampling_args=SAMPLING, num_examples=1)


def test_the_readme_example_runs_as_written(server, capsys):
    """The README's verifiers block, against the tiny served model instead of SmolLM2 (URL and name swapped)."""
    import os
    import re

    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md"),
                  encoding="utf-8").read()
    section = readme.split("### verifiers", 1)[1].split("\n## ", 1)[0]
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL) if "evaluate_sync" in b]
    assert 'AsyncOpenAI(base_url="http://127.0.0.1:8001/v1"' in code and '"smollm2"' in code
    exec(code.replace("http://127.0.0.1:8001/v1", server.url).replace('"smollm2"', repr(server.model_name)), {})
    out = capsys.readouterr().out
    assert re.search(r"reward \d\.\d{3}, solved \d of 4, cut short 0", out), out
