"""Evidence that the actor learns when searching pays (issue 38 item 1): the choice to search-and-ask is a
scored, trained decision, so PPO on the episodes' advantages raises its probability where the bank holds the
answer and lowers it where the bank misleads.

The task is the extractor mechanism test's vault (:class:`tests.test_extractor_mechanism.VaultEnv`): one try
at a keypad whose code is a secret of the vault. The actor is the ``crl`` agent in score mode on a tiny random
model served by the transformers backend: at its one decision it scores the four keys and ``<search>``; a
search asks the bank (the manager has no extractor here, so the answer is the entries themselves) and the
policy then decides again. Like the mechanism test, which isolates the
extractor with a fixed reader actor, this one isolates the tool choice: after an answer that names a code the
actor presses it (a tiny random model cannot learn to read in a few steps, and that is not what is tested);
otherwise it presses the key it scored.

- **Search pays**: the bank holds the red vault's code. Searching wins every time, pressing a key without
  searching about one time in four.
- **Search misleads**: the bank holds a stale code. Searching always loses, pressing a key wins one time in
  four. (In score mode a search never costs an env turn, so an answer that merely says nothing gives a
  search the same outcome as not searching: an advantage of zero in expectation and no direction to assert.)

Everything between the episodes and the weights is the trainer's: :func:`crl_agent.rollout.run_episode`
records each decision as a :class:`~crl_agent.episode.ScoredTurn` (the search choice on
``Step.tool_choices``), group-mean advantages (:func:`crl_agent.rl.split_group_advantages`), the turn samples
of :func:`crl_agent.rl.batches.turn_samples`, and PPO-clip with a :class:`PolicyLearner` on the very weights
the backend serves (:class:`SharedWeights`). Rollouts explore (half uniform), as the trainer's do, so both
choices are sampled in every group. The measure is the policy's own probability of ``<search>`` at the first
decision of held-out episodes (pure policy, no exploration).

Measured (tiny seed 0, 5 PPO steps of 2 groups x 8, lr 2e-2; the same numbers on every run): held-out
P(search) 0.175 -> 0.84 where the bank holds the code, 0.175 -> 0.04 where it misleads. The choice *not* to
search was trained before this issue too (``<search>`` is one of the action decision's candidates), and on
its own it moves the probability the same way, less far (0.745 and 0.055 with the search choices left out of
the samples); what fails without the search choice's own sample is the count of samples per episode below.
"""

from __future__ import annotations

import asyncio
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("hnswlib", reason="the crl agent needs the agent extra")

from crl_agent.agents.crl import SEARCH_CANDIDATE, CRLAgent, CRLPolicy  # noqa: E402
from crl_agent.episode import Episode, EpisodeContext  # noqa: E402
from crl_agent.experience import ExperienceBank  # noqa: E402
from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402
from crl_agent.rl import PolicyLearner, split_group_advantages  # noqa: E402
from crl_agent.rl.batches import turn_samples  # noqa: E402
from crl_agent.rl.weight_sync import SharedWeights  # noqa: E402
from crl_agent.rollout import CallableSlot, run_episode  # noqa: E402
from tests.test_extractor_mechanism import VaultEnv  # noqa: E402

CODE = re.compile(r"press ([1-4])")
COLOUR = "red"
TASK = VaultEnv(COLOUR).task_id
GROUPS, GROUP_SIZE, STEPS, LR = 2, 8, 5, 2e-2
HELD_OUT = range(90_000, 90_016)


class ReaderPolicy(CRLPolicy):
    """The crl policy, except that after a search answer naming a code it presses that code (a fixed reader):
    that action is not the model's decision, so the step keeps no scored action decision, only the
    model's choice to search."""

    told: str | None = None

    async def on_tool(self, reply, info):
        text = await super().on_tool(reply, info)
        found = CODE.search(self.search_log[-1]["answer"])
        self.told = found.group(1) if found else None
        return text

    async def act(self, obs, info):
        action = await super().act(obs, info)
        if self.told is None:
            return action
        turn = self.turns[-1]
        turn.action, turn.scored = f"press {self.told}", None
        return turn.action


class ReaderAgent(CRLAgent):
    policy_class = ReaderPolicy


def first_search_prob(episode: Episode) -> float:
    """The policy's probability of searching at the episode's first decision."""
    first = episode.steps[0].decisions[0]
    return first.probs[first.candidates.index(SEARCH_CANDIDATE)]


async def play(agent: ReaderAgent, contexts: list[EpisodeContext]) -> list[Episode]:
    episodes = await asyncio.gather(*(run_episode(CallableSlot(VaultEnv(COLOUR)), agent, c) for c in contexts))
    assert all(e.error is None for e in episodes), [e.error for e in episodes if e.error]
    return list(episodes)


async def held_out(agent: ReaderAgent) -> float:
    contexts = [EpisodeContext(TASK, s, explore=0.0, learning=False) for s in HELD_OUT]
    episodes = await play(agent, contexts)
    return sum(first_search_prob(e) for e in episodes) / len(episodes)


async def train(llm: TransformersLLM, bank: str, run_dir: str) -> tuple[float, float, list[dict]]:
    agent = ReaderAgent(llm=llm, embedder="hash", bank=bank, run_dir=run_dir, action_mode="score", temperature=1.0,
                        score_norm="mean", max_tool_calls=1, k=1, learning=False)
    agent.manager.extractor = None  # no extractor: search-and-ask answers with the entries themselves
    learner = PolicyLearner(llm.model, lr=LR, loss="ppo", clip_eps=0.2)
    sync, log = SharedWeights(llm), []
    try:
        before = await held_out(agent)
        for step in range(STEPS):
            contexts = [EpisodeContext(TASK, 1000 * step + g, episode_index=g, sample=k, explore=0.5)
                        for g in range(GROUPS) for k in range(GROUP_SIZE)]
            episodes = await play(agent, contexts)
            rewards = [float(e.success) for e in episodes]
            advantages = split_group_advantages(rewards, [c.episode_index for c in contexts],
                                                [True] * len(contexts)).tolist()
            batch = turn_samples(episodes, advantages)
            searched = [bool(e.steps[0].tool_choices) for e in episodes]
            metrics = await sync.run_update(lambda samples=batch.samples: learner.update(samples))
            sync.publish(learner, True)
            log.append({"searched": sum(searched),
                        "win_search": sum(r for r, s in zip(rewards, searched, strict=True) if s),
                        "win_no_search": sum(r for r, s in zip(rewards, searched, strict=True) if not s),
                        "samples": len(batch.samples), "updated": metrics["updated"]})
        after = await held_out(agent)
    finally:
        await agent.aclose()
    return before, after, log


@pytest.fixture
def tiny_llm(tmp_path, one_thread):
    path = build_tiny_chat_model(tmp_path / "tiny", seed=0)
    # one request at a time: no batch composition (which moves the low bits of a padded forward) enters the run
    llm = TransformersLLM(str(path), dtype="float32", max_batch_size=1, seed=0)
    yield llm
    asyncio.run(llm.aclose())


@pytest.mark.parametrize("entry, pays", [("press 3", True), ("press 2", False)], ids=["bank-holds-code", "bank-misleads"])
def test_ppo_on_scored_tool_choices_learns_when_searching_pays(tiny_llm, tmp_path, entry, pays):
    assert VaultEnv.SECRETS[COLOUR] == "3"
    with ExperienceBank(tmp_path / "bank", embedder="hash") as bank:
        bank.add(TASK, "code", entry)
    before, after, log = asyncio.run(train(tiny_llm, str(tmp_path / "bank"), str(tmp_path / "run")))
    print(f"{entry!r}: held-out P(search) {before:.3f} -> {after:.3f}; per step {log}")
    searched = sum(s["searched"] for s in log)
    assert 0 < searched < STEPS * GROUPS * GROUP_SIZE and all(s["updated"] == 1 for s in log)
    # the reader makes a search's outcome what the bank says: always a win, or always a loss
    assert sum(s["win_search"] for s in log) == (searched if pays else 0)
    # one sample per episode: its choice to search, or the key it pressed without searching
    assert all(s["samples"] == GROUPS * GROUP_SIZE for s in log)
    if pays:
        assert after >= max(0.5, before + 0.3), (before, after)
    else:
        assert after <= before / 2, (before, after)
