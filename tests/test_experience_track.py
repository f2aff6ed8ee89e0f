"""The experience track: persistent worlds, the memory agents, and ``eval.run --stream``.

The property tests of issue 49 run on every track task: an oracle that remembers beats the same
oracle with its memory wiped by a wide margin; the notebook agent gains most of that margin; the
random agent gains nothing.
"""

from __future__ import annotations

import asyncio
import copy
import json

import gymnasium as gym
import pytest

pytest.importorskip("nle", reason="the MiniHack track tasks need nle")
pytest.importorskip("alfworld", reason="the ALFWorld track task needs alfworld")

import crl_envs  # noqa: E402,F401
from crl_envs.persistent import episode_seed, world_of  # noqa: E402
from eval import run as eval_run  # noqa: E402
from eval.stream import stream_plan, stream_summary  # noqa: E402

TRACK = ("crl/ALFWorld-House-v0", "crl/MiniHack-Corridors-3-v0", "crl/MiniHack-Corridors-5-v0")


def _stream(tmp_path, agent: str, env_id: str, worlds: int = 4, stream: int = 4) -> dict:
    out = tmp_path / agent.replace(":", "_")
    argv = ["--agent", agent, "--tasks", env_id, "--stream", str(stream), "--episodes", str(worlds),
            "--seed", "1000", "--out", str(out), "--quiet", "--trajectories", "none"]
    assert eval_run.main(argv) == 0
    return json.loads((out / "summary.json").read_text())


def _play(env, seed: int, memory: dict | None) -> tuple[bool, dict]:
    obs, info = env.reset(seed=seed)
    while True:
        obs, reward, term, trunc, info = env.step(env.unwrapped.oracle_action(memory=memory))
        if term or trunc:
            break
    return bool(info["success"]), info


@pytest.mark.parametrize("env_id", TRACK)
def test_a_world_keeps_its_hidden_fact_while_episodes_vary(env_id):
    env = gym.make(env_id)
    firsts, facts = set(), []
    for j in range(3):
        obs, info = env.reset(seed=episode_seed(1003, j))
        assert info["world"] == 1003 and str(1003) in info["task"]
        firsts.add(obs)
        won, end = _play(env, episode_seed(1003, j), memory=None)
        facts.append(end["facts"])
    env.close()
    assert len(firsts) > 1  # episodes of one world differ
    if "Corridors" in env_id:  # the through corridor is the same in every episode that found it
        assert len({f["through"] for f in facts if "through" in f}) <= 1
    else:  # a thing seen twice was in the same place both times
        seen: dict[str, str] = {}
        for f in facts:
            for thing, where in f["locations"].items():
                assert seen.setdefault(thing, where) == where


@pytest.mark.parametrize("env_id", TRACK)
def test_the_solver_that_knows_the_worlds_fact_wins_within_the_budget(env_id):
    explorer, env = gym.make(env_id, max_episode_steps=200), gym.make(env_id)
    for world in (1000, 1001, 1002):
        for j in (0, 1):
            seed = episode_seed(world, j)
            won, end = _play(explorer, seed, memory=None)  # no budget: searching always finds it
            assert won
            won, _ = _play(env, seed, memory=end["facts"])  # what it found, remembered: won on the budget
            assert won, (world, j, end["facts"])
    explorer.close()
    env.close()


@pytest.mark.parametrize("env_id", TRACK)
def test_remembering_beats_forgetting_the_notebook_gains_most_of_it_and_random_nothing(env_id, tmp_path):
    oracle = _stream(tmp_path, "oracle-memory", env_id)["stream"]["tasks"][env_id]
    notebook = _stream(tmp_path, "notebook", env_id)["stream"]["tasks"][env_id]
    rand = _stream(tmp_path, "random", env_id)["stream"]["tasks"][env_id]
    assert oracle["experience_gain"] >= 0.4, oracle  # a wide margin, same seeds
    assert oracle["tail_success_memory"] >= 0.75
    assert notebook["experience_gain"] >= 0.7 * oracle["experience_gain"], (notebook, oracle)
    assert rand["experience_gain"] == 0.0 and rand["curve_memory"] == rand["curve_no_memory"]


def test_stream_records_pair_the_same_seeds_and_the_gain_is_paired_per_world(tmp_path):
    summary = _stream(tmp_path, "oracle-memory", "crl/MiniHack-Corridors-3-v0", worlds=2, stream=3)
    records = [json.loads(line) for line in (tmp_path / "oracle-memory" / "episodes.jsonl").read_text().splitlines()]
    on = sorted((r["seed"], r["stream_index"]) for r in records if r["memory"])
    off = sorted((r["seed"], r["stream_index"]) for r in records if not r["memory"])
    assert on == off and len(on) == 6 and {r["sample"] for r in records} == {0, 1}
    assert {world_of(s) for s, _ in on} == {1000, 1001}
    assert summary["schema_version"] == "1.3" and summary["run"]["stream"] == 3
    assert summary["tasks"]["crl/MiniHack-Corridors-3-v0"]["episodes"] == 6  # the with-memory pass


def test_stream_summary_curves_and_gain_by_hand():
    recs = []
    for w, on, off in ((1000, [0, 1, 1, 1], [0, 0, 1, 0]), (1001, [1, 0, 1, 1], [1, 0, 0, 0])):
        for j in range(4):
            recs.append({"env_id": "e", "world": w, "stream_index": j, "memory": True, "success": bool(on[j])})
            recs.append({"env_id": "e", "world": w, "stream_index": j, "memory": False, "success": bool(off[j])})
    s = stream_summary(recs, ["e"], 4)
    t = s["tasks"]["e"]
    assert s["tail"] == 2 and t["curve_memory"] == [0.5, 0.5, 1.0, 1.0] and t["curve_no_memory"] == [0.5, 0.0, 0.5, 0.0]
    # world 1000: last two (1, 1) vs (1, 0) -> 0.5; world 1001: (1, 1) vs (0, 0) -> 1.0
    assert t["per_world"]["1000"]["gain"] == 0.5 and t["per_world"]["1001"]["gain"] == 1.0
    assert t["experience_gain"] == 0.75 and abs(t["experience_gain_se"] - 0.25) < 1e-12
    assert stream_plan(1000, 2, 3) == {1000: [1_000_000, 1_000_001, 1_000_002], 1001: [1_001_000, 1_001_001, 1_001_002]}


def test_the_memory_agents_neither_read_nor_write_without_experience():
    from crl_agent.agents.notebook import NotebookAgent, RememberingOracleAgent
    from crl_agent.episode import Episode, EpisodeContext, Step

    for agent in (RememberingOracleAgent(), NotebookAgent()):
        key = ("crl/MiniHack-Corridors-3-v0", 1000)
        agent.store[key] = {"through": 2} if agent.name == "oracle-memory" else {"corridor 2": "goes through"}
        calls = []

        async def oracle(calls=calls, **kwargs):
            calls.append(kwargs)
            return "east"

        info = {"world": 1000, "task": "t", "facts": {"through": 3}}
        obs = "Note: corridor 3 goes through to the east room."
        for with_exp in (False, True):
            ctx = EpisodeContext("crl/MiniHack-Corridors-3-v0", 1_000_000, with_experience=with_exp,
                                 learning=with_exp, oracle=oracle)
            policy = agent.make_policy(ctx)
            asyncio.run(policy.act(obs, info))
            ep = Episode("crl/MiniHack-Corridors-3-v0", 1_000_000, final_observation=obs)
            ep.steps.append(Step(0, obs, None, "east", 0.0, True, False, True, False, 0.0, info=info))
            before = copy.deepcopy(agent.store)
            agent.on_episode_end(ctx, ep)
            changed = agent.store != before
            assert changed == with_exp, (agent.name, with_exp)
        assert calls[0] == {} and calls[1] == {"memory": {"through": 2}}
        agent.memory_reset()
        assert agent.store == {}


def test_stream_flag_is_validated():
    with pytest.raises(SystemExit):
        eval_run.main(["--stream", "0", "--tasks", "crl/MiniHack-Corridors-3-v0"])


def test_reflexion_writes_after_a_failure_and_reads_it_back_only_with_memory(tmp_path):
    from crl_agent.agents.reflexion import ReflexionAgent
    from crl_agent.llm.base import LLM, Completion
    from eval.recorder import RunRecorder
    from eval.stream import run_stream_task

    class Scripted(LLM):  # acts "west" (never wins); reflects with a fixed sentence
        name = "scripted"
        prompts: list[str] = []

        async def chat(self, messages, params=None):
            self.prompts.append(messages[0]["content"])
            reflect = "failed" in messages[0]["content"]
            return Completion(text="Go through corridor 2." if reflect else "<action>west", prompt_tokens=1)

        def config(self):
            return {"name": "scripted"}

    llm = Scripted()
    agent = ReflexionAgent(llm=llm, action_mode="generate")
    env_id = "crl/MiniHack-Corridors-3-v0"
    plan = stream_plan(1000, 1, 2)
    recorder = RunRecorder(tmp_path, "text")

    async def both():
        for memory in (True, False):
            await run_stream_task(env_id, agent, recorder, plan, memory=memory, done=set(),
                                  make_kwargs={"max_episode_steps": 2})

    asyncio.run(both())
    recorder.close()
    assert agent.reflections == {(env_id, 1000): ["Go through corridor 2.", "Go through corridor 2."]}
    systems = [p for p in llm.prompts if "failed" not in p]
    shown = ["Reflections from your earlier attempts" in p for p in systems]
    # episode 0 with memory: none yet; episode 1 with memory: the reflection; without memory: never
    assert shown == [False, False, True, True, False, False, False, False]


@pytest.mark.usefixtures("one_thread")
def test_the_trainer_trains_on_a_persistent_world_task(tiny, tmp_path):
    pytest.importorskip("peft")
    from crl_agent.train import main as train_main

    args = ["--out", str(tmp_path), "--quiet", "--tasks", "crl/MiniHack-Corridors-3-v0", "--mode", "grpo",
            "--model", tiny, "--dtype", "float32", "--groups", "1", "--group-size", "2", "--eval-episodes", "2",
            "--eval-every", "0", "--lora-rank", "4", "--steps", "1", "--max-steps", "4"]
    assert train_main(args) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["episodes"] == 2 and rows[0]["errored"] == 0


def test_the_leaderboard_ranks_stream_runs_by_experience_gain_and_refuses_trained_worlds(tmp_path):
    from leaderboards.build import main as build_main
    from leaderboards.schema import SubmissionError, load_submission

    subs = tmp_path / "subs"
    for agent in ("random", "oracle-memory"):
        summary = _stream(tmp_path, agent, "crl/MiniHack-Corridors-3-v0", worlds=2, stream=2)
        folder = subs / f"2026-12-07_{agent}"
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps(summary))
        (folder / "metadata.yaml").write_text(f"name: {agent}\nmodel: none\nagent: {agent}\ndate: '2026-12-07'\n"
                                              "url: ''\nverified: true\n")
    out = tmp_path / "board.md"
    assert build_main(["--submissions", str(subs), "--out", str(out)]) == 0
    track = out.read_text().split("## experience track", 1)[1]
    rows = [line for line in track.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert "oracle-memory" in rows[0] and "random" in rows[1]
    summary = json.loads((subs / "2026-12-07_random" / "summary.json").read_text())
    summary["run"]["seed"] = 3  # training worlds
    (subs / "2026-12-07_random" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(SubmissionError, match="held-out worlds"):
        load_submission(subs / "2026-12-07_random")
