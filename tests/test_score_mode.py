"""Score mode: the llm and crl agents pick among admissible actions by the model's log-probabilities."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import pytest

from crl_agent import prompts
from crl_agent.agents import EpisodeContext
from crl_agent.agents.llm import LLMAgent
from crl_agent.llm import LLM, Completion, SamplingParams
from crl_agent.rollout import CallableSlot, run_episode

SOKOBAN = "crl/Sokoban-6x6-2-v0"


@dataclass
class _Scores:
    logprobs: list[float]
    token_counts: list[int]
    prompt_token_ids: list[int]
    candidate_token_ids: list[list[int]]
    policy_version: int = 0
    model: str = "fake"
    token_logprobs: list = field(default_factory=list)

    def normalised(self, norm="sum"):
        if norm == "sum":
            return list(self.logprobs)
        return [lp / n for lp, n in zip(self.logprobs, self.token_counts, strict=True)]


class PreferenceLLM(LLM):
    """Scores a candidate by a fixed preference table (unknown: -5); chats reply with a fixed text."""

    name = "preference"

    def __init__(self, prefs: dict[str, float], reply: str = "<action>up</action>"):
        self.prefs, self.reply = prefs, reply
        self.score_calls: list[tuple[list, list]] = []
        self.chat_calls: list[list] = []

    async def score_full(self, messages, candidates):
        self.score_calls.append((messages, list(candidates)))
        lps = [self.prefs.get(c, -5.0) for c in candidates]
        return _Scores(lps, [len(c) for c in candidates], [1, 2, 3], [[ord(ch) for ch in c] for c in candidates], 7)

    async def chat(self, messages, params: SamplingParams | None = None) -> Completion:
        self.chat_calls.append(messages)
        return Completion(self.reply, token_ids=[1], prompt_tokens=10)


def play(agent, env_id=SOKOBAN, steps=5, seed=0, sample=0):
    env = gym.make(env_id, max_episode_steps=steps)
    return asyncio.run(run_episode(CallableSlot(env), agent, EpisodeContext(env_id, seed, sample=sample)))


def test_greedy_score_mode_takes_the_best_scored_action_and_never_makes_an_invalid_move():
    llm = PreferenceLLM({"left": -0.5, "up": -2.0})
    ep = play(LLMAgent(llm=llm, temperature=0))
    assert ep.error is None and ep.invalid_actions == 0
    assert [s.action for s in ep.steps] == ["left"] * 5
    assert not llm.chat_calls and len(llm.score_calls) == 5
    turn = ep.steps[0].turn
    assert turn["method"] == "score" and turn["chosen"] == [c["text"] for c in turn["candidates"]].index("left")
    assert turn["policy_version"] == 7 and turn["candidate_token_ids"] and turn["prompt_token_ids"] == [1, 2, 3]
    assert sum(c["prob"] for c in turn["candidates"]) == pytest.approx(1.0)
    # candidates are the admissible actions, as listed
    assert llm.score_calls[0][1] == ep.steps[0].admissible_actions


def test_sampling_follows_the_softmax_of_the_scores_and_samples_differ():
    llm = PreferenceLLM({"left": np.log(0.7), "up": np.log(0.1), "down": np.log(0.1), "right": np.log(0.1)})
    agent = LLMAgent(llm=llm, temperature=1.0)
    actions = [s.action for k in range(40) for s in play(agent, steps=5, sample=k).steps]
    share = actions.count("left") / len(actions)
    assert 0.55 < share < 0.85
    a = [s.action for s in play(agent, sample=1).steps]
    b = [s.action for s in play(agent, sample=1).steps]
    assert a == b, "same episode and sample: same actions"
    turn = play(agent).steps[0].turn
    lp = turn["action_logprob"]
    assert lp == pytest.approx(np.log(turn["candidates"][turn["chosen"]]["prob"]))


def test_mean_norm_divides_by_candidate_length():
    llm = PreferenceLLM({"left": -4.0, "up": -3.0})  # per character: left -1.0, up -1.5
    ep = play(LLMAgent(llm=llm, temperature=0, score_norm="mean"))
    assert ep.steps[0].action == "left"


def test_auto_generates_where_the_env_lists_no_actions_and_score_mode_refuses_there():
    class NoList(gym.Wrapper):
        def reset(self, **kw):
            obs, info = self.env.reset(**kw)
            return obs, {**info, "admissible_actions": None}

        def step(self, action):
            obs, r, te, tr, info = self.env.step(action)
            return obs, r, te, tr, {**info, "admissible_actions": None}

    llm = PreferenceLLM({"left": 0.0})
    env = NoList(gym.make(SOKOBAN, max_episode_steps=3))
    ep = asyncio.run(run_episode(CallableSlot(env), LLMAgent(llm=llm), EpisodeContext(SOKOBAN, 0)))
    assert ep.error is None and len(llm.chat_calls) == 3 and not llm.score_calls
    assert [s.action for s in ep.steps] == ["up"] * 3
    env = NoList(gym.make(SOKOBAN, max_episode_steps=3))
    ep = asyncio.run(run_episode(CallableSlot(env), LLMAgent(llm=llm, action_mode="score"), EpisodeContext(SOKOBAN, 0)))
    assert ep.error and "action_mode='auto'" in ep.error


def test_generate_mode_still_generates():
    llm = PreferenceLLM({"left": 0.0})
    ep = play(LLMAgent(llm=llm, action_mode="generate"), steps=2)
    assert len(llm.chat_calls) == 2 and not llm.score_calls and ep.steps[0].action == "up"


def test_compact_history_grows_at_the_end_so_each_prompt_extends_the_last():
    llm = PreferenceLLM({"left": 0.0, "up": -1.0})
    play(LLMAgent(llm=llm, temperature=0), steps=5)
    prompts_sent = [m for m, _ in llm.score_calls]
    for prev, cur in zip(prompts_sent, prompts_sent[1:], strict=False):
        assert cur[: len(prev) - 1] == prev[:-1], "history is append-only; only the current turn changes"
    last = prompts_sent[-1]
    assert last[1] == {"role": "user", "content": prompts.compact_history_message(0, True)}
    assert last[2] == {"role": "assistant", "content": "left"}
    assert len(last) == 1 + 2 * 4 + 1
    assert "Reply with exactly one of the valid actions" in last[0]["content"]


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="action_mode"):
        LLMAgent(llm=PreferenceLLM({}), action_mode="guess")
    with pytest.raises(ValueError, match="score_norm"):
        LLMAgent(llm=PreferenceLLM({}), score_norm="max")


def test_crl_agent_can_search_in_score_mode(tmp_path):
    pytest.importorskip("hnswlib")
    from crl_agent.agents.crl import SEARCH_CANDIDATE, CRLAgent

    class SearchOnce(PreferenceLLM):
        async def score_full(self, messages, candidates):
            res = await super().score_full(messages, candidates)
            if SEARCH_CANDIDATE in candidates:  # prefer to search while allowed
                res.logprobs[candidates.index(SEARCH_CANDIDATE)] = 5.0
            return res

    llm = SearchOnce({"left": 0.0}, reply="Which way to push?")

    async def go():
        agent = CRLAgent(llm=llm, embedder="hash", run_dir=str(tmp_path / "run"), temperature=0, max_tool_calls=1)
        try:
            agent.bank.add(SOKOBAN, "Push left", "If the box is right of you, then push left.")
            env = gym.make(SOKOBAN, max_episode_steps=3)
            return await run_episode(CallableSlot(env), agent, EpisodeContext(SOKOBAN, 0))
        finally:
            await agent.aclose()

    ep = asyncio.run(go())
    assert ep.error is None and ep.invalid_actions == 0
    assert [s.action for s in ep.steps] == ["left"] * 3
    turn = ep.steps[0].turn
    assert turn["searches"][0]["question"] == "Which way to push?" and turn["searches"][0]["answer"]
    assert SEARCH_CANDIDATE not in [c["text"] for c in turn["candidates"]], "no searches left: rescored without it"
    assert ep.extra["searches"] == 1


def test_each_scored_decision_of_a_turn_is_a_scored_turn_the_trainer_learns_from(tmp_path):
    """Issue 38 item 1: choosing to search is a decision of its own (its candidates, probs, chosen index and
    log-probs), and so is choosing an action while search was a candidate; both reach turn_samples."""
    pytest.importorskip("hnswlib")
    from crl_agent.agents.crl import SEARCH_CANDIDATE, CRLAgent
    from crl_agent.rl.batches import turn_samples

    class SearchFirstTurn(PreferenceLLM):
        async def score_full(self, messages, candidates):
            res = await super().score_full(messages, candidates)
            if SEARCH_CANDIDATE in candidates and len(self.score_calls) == 1:  # search at the first decision only
                res.logprobs[candidates.index(SEARCH_CANDIDATE)] = 20.0
            return res

    llm = SearchFirstTurn({"left": 0.0, "up": -1.0}, reply="Which way to push?")

    async def go():
        agent = CRLAgent(llm=llm, embedder="hash", run_dir=str(tmp_path / "run"), temperature=1.0, max_tool_calls=2)
        try:
            agent.bank.add(SOKOBAN, "Push left", "If the box is right of you, then push left.")
            env = gym.make(SOKOBAN, max_episode_steps=2)
            return await run_episode(CallableSlot(env), agent, EpisodeContext(SOKOBAN, 0))
        finally:
            await agent.aclose()

    ep = asyncio.run(go())
    assert ep.error is None and ep.extra["searches"] == 1
    first, second = ep.steps
    (search,) = first.tool_choices
    assert search.candidates[search.chosen] == SEARCH_CANDIDATE
    assert search.action_logprob == pytest.approx(np.log(search.probs[search.chosen]))
    assert search.behaviour_logprob == pytest.approx(search.action_logprob)
    assert len(search.candidate_token_ids) == len(search.candidates) and search.prompt_token_ids == [1, 2, 3]
    assert first.scored is not None and first.scored.candidates[first.scored.chosen] == first.action
    assert first.decisions == [search, first.scored]
    # the second step did not search, but search was one of its candidates: choosing not to is trained too
    assert not second.tool_choices and SEARCH_CANDIDATE in second.scored.candidates
    assert second.decisions == [second.scored]
    # the trace lists the tool choice (without token ids) beside the searches; the episode record is unchanged
    (traced,) = first.turn["tool_choices"]
    assert traced["chosen"] == search.chosen and traced["candidates"][search.chosen]["text"] == SEARCH_CANDIDATE
    assert "prompt_token_ids" not in traced and first.turn["searches"][0]["question"] == "Which way to push?"
    assert first.turn["chosen"] == first.scored.chosen
    assert not {"scored", "tool_choices"} & set(ep.to_dict()["steps"][0])
    # every decision becomes a sample carrying the episode's advantage (turn weighting: each weighs the same)
    batch = turn_samples([ep], [0.5], weighting="turn")
    assert [s.chosen for s in batch.samples] == [search.chosen, first.scored.chosen, second.scored.chosen]
    assert [s.candidate_ids for s in batch.samples][0] == search.candidate_token_ids
    assert [s.old_logprobs for s in batch.samples][0] == [search.action_logprob]
    assert all(s.advantage == pytest.approx(0.5) for s in batch.samples) and batch.loss_weight == 3.0
