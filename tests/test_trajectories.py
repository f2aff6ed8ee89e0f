"""Episodes as data: the trajectories file, its two modes, samples per seed, and bad traces."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import warnings

import gymnasium as gym
import pytest

from crl_agent.agents import Agent, EpisodeContext, Policy
from crl_agent.rollout import CallableSlot, episode_key, run_episode
from crl_envs.core import StepOutcome, TextEnv
from crl_envs.spaces import UnicodeText
from eval import trajectories
from eval.results import EpisodeLog
from eval.run import main

SOKOBAN = "crl/Sokoban-6x6-2-v0"


class BigObsEnv(TextEnv):
    """Every observation is about 1 MB: how big text is stored."""

    family = "BigObs"

    def __init__(self, render_mode=None):
        super().__init__(render_mode=render_mode)
        self.observation_space = UnicodeText(2_000_000)

    def _reset_task(self, options):
        return "start " + "x" * 1_000_000 + " end", {"task": "say done"}

    def _apply(self, action):
        return StepOutcome(obs="obs " + "y" * 1_000_000 + " tail", reward=1.0, terminated=True,
                           success=True, progress=1.0)

    def _admissible_actions(self):
        return ["done"]


if "test/BigObs-v0" not in gym.registry:
    gym.register("test/BigObs-v0", entry_point="tests.test_trajectories:BigObsEnv", max_episode_steps=3)


class _TracingPolicy(Policy):
    """Acts from the admissible list and traces what an LLM policy would, token ids included."""

    def __init__(self, ctx, odd: bool = False):
        self.ctx, self.odd, self.n = ctx, odd, 0

    async def act(self, obs, info):
        self.n += 1
        return info["admissible_actions"][(self.ctx.seed + self.n) % len(info["admissible_actions"])]

    def turn_trace(self):
        trace = {"messages": [{"role": "user", "content": "obs"}], "reply": "", "method": "score",
                 "policy_version": 3, "candidates": [{"text": "up", "logprob": -0.1, "prob": 0.9}], "chosen": 0,
                 "prompt_token_ids": [1, 2, 3], "candidate_token_ids": [[4, 5]], "token_ids": [], "logprobs": []}
        if self.odd:
            trace["handle"] = object()  # not JSON: replaced by its repr, with a warning naming it
            trace["ids"] = {1, 2}
        return trace


class TracingAgent(Agent):
    name = "tracing"

    def __init__(self, odd: bool = False):
        self.odd = odd
        self.seen = []

    def make_policy(self, ctx):
        return _TracingPolicy(ctx, self.odd)

    def on_episode_end(self, ctx, episode):
        self.seen.append(episode)


def _run(out, *args):
    return main(["--quiet", "--out", str(out), *args])


def test_an_episode_round_trips_and_text_differs_from_full_only_in_the_documented_fields(tmp_path):
    args = ["--agent", "tests.test_trajectories:TracingAgent", "--tasks", SOKOBAN, "--episodes", "3",
            "--max-steps", "6"]
    _run(tmp_path / "full", *args, "--trajectories", "full")
    _run(tmp_path / "text", *args)
    full = trajectories.load_trajectories(tmp_path / "full", validate=True)
    text = trajectories.load_trajectories(tmp_path / "text", validate=True)
    assert [r["key"] for r in full] == [episode_key(SOKOBAN, s, 0) for s in range(3)]
    assert full[0]["steps"][0]["turn"]["prompt_token_ids"] == [1, 2, 3]
    assert "prompt_token_ids" not in text[0]["steps"][0]["turn"]

    def strip(r):
        r = json.loads(json.dumps(r))
        r.pop("mode")
        r["summary"].pop("wall_time_s")
        for s in r["steps"]:
            for k in trajectories.FULL_ONLY_TURN_FIELDS:
                s["turn"].pop(k, None)
        return r

    assert [strip(r) for r in full] == [strip(r) for r in text]
    # the record is the episode: steps chain, the final observation is the last step's result
    records = EpisodeLog(tmp_path / "full" / "episodes.jsonl").latest()
    for r in full:
        assert r["summary"]["actions"] == len(r["steps"]) == records[r["key"]]["actions"]
        assert [s["t"] for s in r["steps"]] == list(range(len(r["steps"])))
        assert r["task"] and r["final_observation"] and r["agent"] == "tracing"
    env = gym.make(SOKOBAN, max_episode_steps=6)
    obs, info = env.reset(seed=full[1]["seed"])
    for s in full[1]["steps"]:
        assert s["observation"] == obs and s["admissible_actions"] == info["admissible_actions"]
        obs, reward, term, trunc, info = env.step(s["action"])
        assert (s["reward"], s["terminated"], s["truncated"]) == (reward, term, trunc)
    assert full[1]["final_observation"] == obs


def test_none_writes_no_trajectories(tmp_path):
    _run(tmp_path, "--agent", "random", "--tasks", SOKOBAN, "--episodes", "2", "--trajectories", "none")
    assert not (tmp_path / trajectories.FILENAME).exists()
    assert trajectories.load_trajectories(tmp_path) == []
    assert len(EpisodeLog(tmp_path / "episodes.jsonl").latest()) == 2


def test_samples_give_k_records_per_seed_with_distinct_sampling_and_pass_at_k(tmp_path):
    _run(tmp_path, "--agent", "random", "--tasks", SOKOBAN, "--episodes", "3", "--samples", "4", "--max-steps", "8")
    latest = EpisodeLog(tmp_path / "episodes.jsonl").latest()
    assert sorted(latest) == sorted(episode_key(SOKOBAN, s, k) for s in range(3) for k in range(4))
    trajs = {r["key"]: r for r in trajectories.load_trajectories(tmp_path)}
    for seed in range(3):
        actions = {tuple(s["action"] for s in trajs[episode_key(SOKOBAN, seed, k)]["steps"]) for k in range(4)}
        assert len(actions) > 1, "the samples of one seed must not replay the same actions"
    task = json.loads((tmp_path / "summary.json").read_text())["tasks"][SOKOBAN]
    assert task["episodes"] == 12 and task["seeds"] == 3 and task["samples"] == 4
    assert set(task["pass_at_k"]) == {"1", "2", "4"}
    assert task["pass_at_k"]["1"] == pytest.approx(task["success"])
    assert task["pass_at_k"]["1"] <= task["pass_at_k"]["2"] <= task["pass_at_k"]["4"]
    # sample 0 is the episode a --samples 1 run plays: the same actions as before samples existed
    _run(tmp_path / "one", "--agent", "random", "--tasks", SOKOBAN, "--episodes", "3", "--max-steps", "8")
    one = {r["key"]: r for r in trajectories.load_trajectories(tmp_path / "one")}
    for seed in range(3):
        key = episode_key(SOKOBAN, seed, 0)
        assert [s["action"] for s in one[key]["steps"]] == [s["action"] for s in trajs[key]["steps"]]


def test_pass_at_k_is_the_unbiased_estimate():
    from eval.results import pass_at_k

    recs = [{"seed": 0, "success": s} for s in (True, False, False, False)] + \
           [{"seed": 1, "success": s} for s in (False,) * 4]
    got = pass_at_k(recs, 4)
    assert got["1"] == pytest.approx((0.25 + 0) / 2)
    assert got["2"] == pytest.approx((1 - 3 / 6) / 2)  # 1 - C(3,2)/C(4,2)
    assert got["4"] == pytest.approx(0.5)


def test_a_trace_json_cannot_hold_is_kept_as_its_repr_with_a_warning(tmp_path):
    agent = TracingAgent(odd=True)
    env = gym.make(SOKOBAN, max_episode_steps=2)
    import asyncio

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ep = asyncio.run(run_episode(CallableSlot(env), agent, EpisodeContext(SOKOBAN, 0)))
    assert ep.error is None and ep.actions == 2
    turn = ep.steps[0].turn
    assert turn["handle"].startswith("<object object") and sorted(turn["ids"]) == [1, 2]
    assert any("turn.handle" in str(w.message) for w in caught)
    json.dumps(ep.to_dict())  # the whole episode is JSON now
    assert agent.seen == [ep] and ep.final_observation


def test_a_megabyte_observation_is_whole_in_full_mode_and_capped_in_text_mode(tmp_path):
    for mode in ("full", "text"):
        _run(tmp_path / mode, "--agent", "random", "--tasks", "test/BigObs-v0", "--episodes", "1",
             "--trajectories", mode)
    full = trajectories.load_trajectories(tmp_path / "full")[0]
    text = trajectories.load_trajectories(tmp_path / "text")[0]
    assert len(full["steps"][0]["observation"]) > 1_000_000 and full["final_observation"].endswith(" tail")
    obs = text["steps"][0]["observation"]
    assert len(obs) < trajectories.TEXT_CAP + 100 and "characters omitted" in obs
    assert obs.startswith("start xxx") and obs.endswith("x end")
    assert text["final_observation"].endswith(" tail") and len(text["final_observation"]) < trajectories.TEXT_CAP + 100


def test_a_torn_trajectories_file_is_skipped_with_a_warning_and_resume_repairs_it(tmp_path):
    args = ["--agent", "random", "--tasks", SOKOBAN, "--episodes", "3", "--max-steps", "5"]
    _run(tmp_path, *args)
    path = tmp_path / trajectories.FILENAME
    whole = path.read_bytes()
    extra = gzip.compress(b'{"key": "x", "steps": [' + b"1," * 5000, mtime=0)
    path.write_bytes(whole + extra[: len(extra) // 2])  # killed mid-write
    with pytest.warns(UserWarning, match="torn"):
        assert len(trajectories.load_trajectories(tmp_path)) == 3
    os.remove(tmp_path / "summary.json")
    _run(tmp_path, *args[:-4], "--episodes", "4", "--max-steps", "5", "--resume")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # repaired: no torn member left
        got = trajectories.load_trajectories(tmp_path, validate=True)
    assert sorted(r["key"] for r in got) == sorted(EpisodeLog(tmp_path / "episodes.jsonl").latest())
    assert len(got) == 4


def test_resume_drops_a_trajectory_whose_episode_was_never_recorded(tmp_path):
    args = ["--agent", "random", "--tasks", SOKOBAN, "--episodes", "3", "--max-steps", "5"]
    _run(tmp_path, *args)
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    (tmp_path / "episodes.jsonl").write_text("\n".join(lines[:2]) + "\n")  # the kill came between the two writes
    _run(tmp_path, *args, "--resume")
    members, _, torn = trajectories._read_members(tmp_path / trajectories.FILENAME)
    keys = [m["key"] for m in members]
    assert not torn and sorted(keys) == sorted(set(keys)) == sorted(EpisodeLog(tmp_path / "episodes.jsonl").latest())


def test_members_larger_than_a_read_chunk_are_read_whole_and_a_torn_tail_is_found(tmp_path):
    import gzip
    import random

    rng = random.Random(0)
    big = "".join(rng.choice("abcdefghij") for _ in range(400_000))  # compresses to several 64 KiB chunks
    rows = [{"key": "a", "text": "x"}, {"key": "b", "text": big}, {"key": "c", "text": "y"}]
    path = tmp_path / trajectories.FILENAME
    whole = b"".join(gzip.compress((json.dumps(r) + "\n").encode()) for r in rows)
    path.write_bytes(whole + gzip.compress(b'{"key": "d"}\n')[:-7])  # the last member cut short
    members, good_end, torn = trajectories._read_members(path)
    assert [m["key"] for m in members] == ["a", "b", "c"] and members[1]["text"] == big
    assert good_end == len(whole) and torn


def test_a_schema_1_1_run_still_resumes_and_reports(tmp_path):
    args = ["--agent", "random", "--tasks", SOKOBAN, "--episodes", "2", "--max-steps", "5"]
    _run(tmp_path, *args, "--trajectories", "none")
    old = []
    for line in (tmp_path / "episodes.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("sample")
        r["key"] = f"{r['env_id']}#{r['seed']}"  # how 1.1 keyed episodes
        old.append(json.dumps(r))
    (tmp_path / "episodes.jsonl").write_text("\n".join(old) + "\n")
    summary = json.loads((tmp_path / "summary.json").read_text())
    summary["schema_version"] = "1.1"
    for k in ("samples", "trajectories"):
        summary["run"].pop(k)
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    from eval.report import load_run

    _, records = load_run(tmp_path)
    assert len(records) == 2
    _run(tmp_path, *args[:-4], "--episodes", "3", "--max-steps", "5", "--trajectories", "none", "--resume")
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 3, "the two 1.1 episodes are not played again"
    assert json.loads((tmp_path / "summary.json").read_text())["tasks"][SOKOBAN]["episodes"] == 3


def test_validate_names_the_broken_field():
    rec = {"schema": trajectories.SCHEMA, "schema_version": "1.0", "mode": "text", "key": "k", "env_id": "e",
           "seed": 0, "sample": 0, "agent": "a", "task": "", "summary": {}, "final_observation": "",
           "steps": [{"t": 0, "observation": "o", "action": 3}]}
    with pytest.raises(trajectories.TrajectoryError, match=r"steps\[0\]\.action"):
        trajectories.validate_record(rec)
    with pytest.raises(trajectories.TrajectoryError, match="lacks 'steps'"):
        trajectories.validate_record({k: v for k, v in rec.items() if k != "steps"})


class SleepyEnv(TextEnv):
    """Its one step takes 2 s (an SWE grade, an ALFWorld game generation)."""

    family = "Sleepy"

    def _reset_task(self, options):
        return "wait", {"task": "wait"}

    def _apply(self, action):
        import time

        time.sleep(2.0)
        return StepOutcome(obs="done", reward=1.0, terminated=True, success=True, progress=1.0)

    def _admissible_actions(self):
        return ["wait"]


if "test/Sleepy-v0" not in gym.registry:
    gym.register("test/Sleepy-v0", entry_point="tests.test_trajectories:SleepyEnv", max_episode_steps=2)


class _Clock(Policy):
    def __init__(self, agent, env_id):
        self.agent, self.env_id = agent, env_id

    async def act(self, obs, info):
        import time

        self.agent.acts.append((self.env_id, time.monotonic()))
        await asyncio.sleep(0.01)  # like a model call: spreads the fast task's steps over seconds
        return info["admissible_actions"][0]


class ClockAgent(Agent):
    """Records when each env's policy acted."""

    name = "clock"
    acts: list = []

    def make_policy(self, ctx):
        return _Clock(ClockAgent, ctx.env_id)


def test_inline_envs_run_off_the_loop_so_a_slow_step_never_freezes_another_task(tmp_path):
    ClockAgent.acts = []
    _run(tmp_path, "--agent", "tests.test_trajectories:ClockAgent", "--tasks", f"test/Sleepy-v0,{SOKOBAN}",
         "--episodes", "3", "--max-steps", "400")
    sleepy = [t for e, t in ClockAgent.acts if e == "test/Sleepy-v0"]
    fast = [t for e, t in ClockAgent.acts if e == SOKOBAN]
    assert len(sleepy) == 3 and fast[-1] - fast[0] > 1.0
    # while each 2 s step ran (from its act until the next one), the Sokoban task kept stepping
    windows = [(a + 0.2, a + 1.8) for a in sleepy if fast[0] < a + 0.2 and a + 1.8 < fast[-1]]
    assert windows, "the fast task must overlap a slow step"
    for lo, hi in windows:
        assert sum(lo < t < hi for t in fast) > 20, "the other task's steps went on while the slow step ran"


def test_records_are_standard_json_whatever_they_hold(tmp_path):
    """orjson writes the records; what it refuses (a lone surrogate from a bytes-decoded observation) falls
    back to the json module, and non-finite numbers are null either way, so any JSON reader loads the file."""
    record = {"key": "k#0#0", "reward": float("nan"), "info": {1: float("inf"), "obj": object}, "text": "é"}
    fast = json.loads(trajectories.encode_line(record))
    assert fast["reward"] is None and fast["info"]["1"] is None and fast["text"] == "é"
    assert fast["info"]["obj"] == str(object)
    odd = dict(record, text="bad \udc80 byte", big=2**70)
    slow = trajectories.encode_line(odd)
    assert slow.isascii() and slow.endswith(b"\n")
    back = json.loads(slow)
    assert back["text"] == "bad \udc80 byte" and back["big"] == 2**70 and back["reward"] is None
    assert back["info"] == fast["info"]
    path = tmp_path / trajectories.FILENAME
    path.write_bytes(trajectories.encode_member(record) + trajectories.encode_member(dict(odd, key="k#1#0")))
    assert [r["key"] for r in trajectories.load_trajectories(path)] == ["k#0#0", "k#1#0"]
