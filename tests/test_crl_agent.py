from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import pytest

pytest.importorskip("hnswlib", reason="the crl agent needs the agent extra")

from crl_agent.agents import EpisodeContext  # noqa: E402
from crl_agent.agents.crl import EXPERIENCE_HEADER, CRLAgent  # noqa: E402
from crl_agent.experience import ExperienceBank  # noqa: E402
from crl_agent.experience.extractor import ANSWER_SYSTEM, DISTIL_SYSTEM, MERGE_SYSTEM  # noqa: E402
from crl_agent.rollout import CallableSlot, run_episode  # noqa: E402
from tests.test_experience_manager import ScriptedLLM  # noqa: E402

ENV = "crl/Sokoban-6x6-1-v0"


class Script:
    """Plays the actor and the extractor from one fake model, recording who was asked what."""

    def __init__(self, actor_replies=("<action>left</action>",)):
        self.actor_replies = list(actor_replies)
        self.actor_chats: list[list[dict]] = []
        self.distils = 0

    def __call__(self, messages):
        system = messages[0]["content"]
        if system == DISTIL_SYSTEM:
            self.distils += 1
            n = self.distils
            return json.dumps({"operations": [{"op": "add", "title": f"Lesson {n}",
                                               "content": f"If box {n} is stuck against wall {n}, then restart."}]})
        if system == MERGE_SYSTEM:
            return '{"op": "KEEP"}'
        if system == ANSWER_SYSTEM:
            return "Push boxes away from corners."
        self.actor_chats.append(messages)
        return self.actor_replies.pop(0) if len(self.actor_replies) > 1 else self.actor_replies[0]


def make(tmp_path, script, **kw) -> CRLAgent:
    kw.setdefault("run_dir", str(tmp_path / "run"))
    kw.setdefault("action_mode", "generate")  # these pin the generation path; test_score_mode covers scoring
    kw.setdefault("history_style", "full")
    return CRLAgent(llm=ScriptedLLM(script), embedder="hash", **kw)


async def play(agent: CRLAgent, seeds, max_steps: int = 3):
    results = []
    for i, seed in enumerate(seeds):
        env = gym.make(ENV, max_episode_steps=max_steps)
        results.append(await run_episode(CallableSlot(env), agent, EpisodeContext(ENV, seed, i)))
        env.close()
    return results


def test_the_bank_fills_across_episodes_and_entries_reach_later_prompts(tmp_path):
    script = Script()
    agent = make(tmp_path, script, sync_experience=True)

    async def main():
        results = await play(agent, [0, 1, 2])
        await agent.aclose()
        return results

    results = asyncio.run(main())
    assert all(r.error is None for r in results)
    first_system = script.actor_chats[0][0]["content"]
    assert EXPERIENCE_HEADER not in first_system  # the bank was empty at the first episode
    last_episode_system = script.actor_chats[-1][0]["content"]
    assert EXPERIENCE_HEADER in last_episode_system and "Lesson 1" in last_episode_system
    assert "<search>" in last_episode_system  # the tool is offered once the task has entries
    assert results[-1].extra["experience_shown"] >= 1 and results[-1].extra["bank_entries"] >= 2
    with ExperienceBank(tmp_path / "run" / "experience_bank", embedder="hash") as bank:
        assert {e.title for e in bank.entries(ENV)} == {"Lesson 1", "Lesson 2", "Lesson 3"}
        assert all(e.task == ENV and e.sources for e in bank.entries())
    log = [json.loads(x) for x in (tmp_path / "run" / "extractor_calls.jsonl").read_text().splitlines()]
    assert sum(r["type"] == "call" and r["kind"] == "distil" for r in log) == 3
    assert any(r["type"] == "outcome" for r in log)  # episodes 2 and 3 were guided by entries
    cfg = agent.config()
    assert cfg["experience"] == "on" and cfg["bank"].endswith("experience_bank") and cfg["extractor"] == "actor"
    assert cfg["experience_stats"]["bank_entries"] == 3


def test_search_tag_asks_the_manager_and_the_answer_is_not_sent_to_the_env(tmp_path):
    bank_dir = tmp_path / "bank"
    with ExperienceBank(bank_dir, embedder="hash") as bank:
        bank.add(ENV, "Corners", "If a box is pushed into a corner, then restart.")
    replies = ["<search>how do I avoid corners?", "<search>again?", "<search>and again?", "<action>left</action>"]
    script = Script(replies)
    agent = make(tmp_path, script, bank=str(bank_dir))

    async def main():
        (result,) = await play(agent, [0], max_steps=1)
        await agent.aclose()
        return result

    result = asyncio.run(main())
    assert result.error is None and result.actions == 1  # three searches, one env step
    assert result.extra["searches"] == 2 and result.extra["search_time_s"] > 0
    chats = script.actor_chats
    assert "Push boxes away from corners." in chats[1][-1]["content"]  # the answer came back as a user message
    assert "No tool calls left" in chats[3][-1]["content"]  # the third search was refused
    assert all(m["role"] != "tool" for m in chats[-1])
    log = [json.loads(x) for x in (tmp_path / "run" / "extractor_calls.jsonl").read_text().splitlines()]
    answers = [r for r in log if r["type"] == "call" and r["kind"] == "answer"]
    assert len(answers) == 2
    outcome = next(r for r in log if r["type"] == "outcome")
    assert set(a["call_id"] for a in answers) <= set(outcome["call_ids"])


def test_experience_off_opens_no_bank_offers_no_tool_and_distils_nothing(tmp_path):
    script = Script(["<search>hint?", "<action>left</action>"])
    agent = make(tmp_path, script, experience="off")

    async def main():
        results = await play(agent, [0, 1], max_steps=2)
        await agent.aclose()
        return results

    results = asyncio.run(main())
    assert not (tmp_path / "run" / "experience_bank").exists() and agent.bank is None
    assert script.distils == 0 and EXPERIENCE_HEADER not in script.actor_chats[0][0]["content"]
    assert results[0].extra["searches"] == 0 and "bank_entries" not in results[0].extra
    assert agent.config()["experience"] == "off" and agent.config()["bank"] is None


def test_a_bank_from_one_run_guides_the_next(tmp_path):
    bank_dir = tmp_path / "shared_bank"

    async def run_once(run: str, script: Script):
        agent = make(tmp_path, script, bank=str(bank_dir), run_dir=str(tmp_path / run))
        await play(agent, [0])
        await agent.aclose()

    asyncio.run(run_once("run1", Script()))
    second = Script()
    asyncio.run(run_once("run2", second))
    assert "Lesson 1" in second.actor_chats[0][0]["content"]


def test_bad_options_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="'on' or 'off'"):
        make(tmp_path, Script(), experience="maybe")


def test_without_a_run_dir_the_bank_is_temporary(tmp_path):
    agent = CRLAgent(llm=ScriptedLLM(Script()), embedder="hash", action_mode="generate")
    path = agent.bank_path
    assert path.exists() and agent.config()["bank"] is None
    asyncio.run(agent.aclose())
    assert not path.exists()


@pytest.mark.slow
def test_eval_run_drives_crl_with_a_real_tiny_model(tmp_path):
    pytest.importorskip("torch")
    from crl_agent.llm.tiny import build_tiny_chat_model
    from eval.run import main

    model = build_tiny_chat_model(tmp_path / "tiny")
    out, bank = tmp_path / "run", tmp_path / "bank"
    argv = ["--agent", "crl", "--tasks", ENV, "--episodes", "2", "--max-steps", "2", "--out", str(out), "--quiet",
            "--model", str(model), "--bank", str(bank), "--agent-arg", "embedder=hash", "--agent-arg", "max_tokens=8"]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    agent = summary["agent"]
    assert agent["name"] == "crl" and agent["experience"] == "on" and agent["bank"] == str(bank)
    assert agent["extractor"] == "actor" and agent["experience_stats"]["distillations"] == 2
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert all("search_time_s" in e["extra"] for e in episodes)
    assert (out / "extractor_calls.jsonl").exists() and list(bank.glob("index-*.hnsw"))


def test_actor_critique_rejects_entries_it_judges_unhelpful_before_they_are_shown(tmp_path):
    class Critic(Script):
        def __call__(self, messages):
            text = messages[-1]["content"]
            if text.endswith("Answer yes or no."):
                return "no" if "Lesson 1" in text else "yes"
            return super().__call__(messages)

    async def go():
        script = Critic()
        agent = make(tmp_path, script, critique="true", sync_experience=True)
        eps = await play(agent, [0, 1, 2])
        await agent.aclose()
        return script, eps

    script, eps = asyncio.run(go())
    last_system = script.actor_chats[-1][0]["content"]
    assert "Lesson 2" in last_system and "Lesson 1" not in last_system  # judged unhelpful, so never shown
    verdicts = eps[-1].steps[0].turn["critique"]
    assert {v["title"]: v["kept"] for v in verdicts} == {"Lesson 1": False, "Lesson 2": True}
    with pytest.raises(ValueError, match="critique must be true or false"):
        make(tmp_path / "x", Script(), critique="maybe")


def test_manager_config_from_the_command_line_takes_plain_dicts_for_sampling(tmp_path):
    agent = make(tmp_path, Script(), manager_config={"distil_params": {"max_tokens": 7, "temperature": 0.5},
                                                     "max_trajectory_chars": 900})
    try:
        cfg = agent.manager.config
        assert (cfg.distil_params.max_tokens, cfg.distil_params.temperature, cfg.max_trajectory_chars) == (7, 0.5, 900)
    finally:
        asyncio.run(agent.aclose())


def test_a_rank_with_an_outbox_plays_from_a_bank_snapshot_and_rank_0_credits_and_distils(tmp_path):
    """What a trainer's ranks other than 0 do: search a copy of rank 0's bank, send episodes to rank 0."""
    owner_script, other_script = Script(), Script()
    owner = make(tmp_path / "rank0", owner_script, sync_experience=True)
    other = make(tmp_path / "rank1", other_script)
    other.outbox = []

    async def main():
        owner.bank.add(ENV, "Corners", "If a box is pushed into a corner, then restart.", origin="call-0")
        await owner.manager.flush()
        await other.load_bank_snapshot(owner.bank_path)
        owner.bank.add(ENV, "Later", "Added after the copy: rank 1 cannot see it yet.")
        (result,) = await play(other, [0])
        assert result.error is None and result.extra["experience_shown"] == 1
        assert "Corners" in other_script.actor_chats[0][0]["content"]
        assert "Later" not in other_script.actor_chats[0][0]["content"]
        # nothing was credited or distilled on rank 1: its episode waits in the outbox
        (credit,) = other.outbox
        assert credit.trajectory is not None and [e.title for e in credit.guided] == ["Corners"]
        assert other.manager.pending == 0 and other_script.distils == 0
        owner.credit(credit, remote=True)
        await owner.manager.flush()
        retrieved = owner.bank.get(credit.guided[0].id).retrieve_count
        with pytest.raises(ValueError, match="own bank"):
            await owner.load_bank_snapshot(owner.bank_path)
        await other.aclose()
        await owner.aclose()
        return retrieved

    retrieved = asyncio.run(main())
    assert owner_script.distils == 1 and retrieved == 1  # rank 0 distilled it and recorded the retrieval
    log = [json.loads(x) for x in (tmp_path / "rank0" / "run" / "extractor_calls.jsonl").read_text().splitlines()]
    outcome = next(r for r in log if r["type"] == "outcome")
    assert outcome["call_ids"] == ["call-0"] and outcome["outcome"] == -1.0


def test_the_crl_options_come_as_one_dataclass_or_as_keywords_that_override_it(tmp_path):
    from crl_agent.agents.crl import CRLOptions
    from eval.run import make_agent

    opts = CRLOptions(embedder="hash", k=2, bank=str(tmp_path / "bank"), critique="on")
    agent = CRLAgent(llm=ScriptedLLM(Script()), options=opts, k=3)
    try:
        assert (agent.k, agent.critique, agent.embedder_spec, agent.bank_path) == (3, True, "hash", tmp_path / "bank")
        assert opts.k == 2  # the caller's options are left as they were
    finally:
        asyncio.run(agent.aclose())
    with pytest.raises(ValueError, match="experience must be 'on' or 'off'"):
        CRLAgent(llm=ScriptedLLM(Script()), experience="maybe")
    # eval.run's flags reach the options (--experience off: no bank is opened)
    agent = make_agent("crl", 0, {"experience": "off", "llm": ScriptedLLM(Script())}, run_dir=tmp_path / "run")
    try:
        assert agent.experience == "off" and agent.bank is None
    finally:
        asyncio.run(agent.aclose())
