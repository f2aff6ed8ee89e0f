"""The trainer end to end (``python -m crl_agent.train``) on a one-step text bandit with the tiny model."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import signal

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.train import TrainConfig, build_parser, main, train  # noqa: E402
from tests.test_rl_bandit import DoorEnv  # noqa: E402

DOORS = "test/Doors-v0"
if DOORS not in gym.registry:
    gym.register(DOORS, entry_point="tests.test_rl_bandit:DoorEnv", max_episode_steps=1)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny and one_thread: tests/conftest.py


def test_grpo_training_takes_the_tiny_model_from_chance_to_solving_held_out_seeds(tiny, tmp_path):
    cfg = TrainConfig(tasks=DOORS, mode="grpo", model=tiny, dtype="float32", steps=25, groups=2, group_size=8,
                      lr=3e-3, lora_rank=0, score_norm="mean", eval_every=25, eval_episodes=48, seed=0)
    evals = asyncio.run(train(cfg, tmp_path, quiet=True))
    first, last = evals[0], evals[-1]
    assert 0.05 <= first["success"] <= 0.5, first  # about chance: 1 door in 4
    assert last["success"] >= 0.9, evals
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 25 and all(r["errored"] == 0 for r in rows)
    assert any(r.get("actor/samples_used", 0) > 0 for r in rows)
    assert (tmp_path / "curve.png").stat().st_size > 1000


def test_each_part_of_a_step_is_timed_apart_and_the_diagnostics_run_every_n_steps(tiny, tmp_path):
    cfg = TrainConfig(tasks=DOORS, mode="grpo", model=tiny, dtype="float32", steps=4, groups=1, group_size=4,
                      lora_rank=4, score_norm="mean", eval_every=0, eval_episodes=2, diagnose_every=2,
                      dynamic_sampling=0, seed=0)
    asyncio.run(train(cfg, tmp_path, quiet=True))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    parts = ("bank_s", "extractor_wait_s", "rollout_s", "actor_update_s", "diagnose_s")
    for r in rows:
        assert all(r[k] >= 0 for k in parts) and r["rollout_s"] > 0 and r["actor_update_s"] > 0
        assert sum(r[k] for k in parts) <= r["time_s"]  # disjoint parts of the step
        assert r["extractor_wait_s"] < 0.05 and "update_s" not in r  # grpo: no extractor to wait for
    # the divergence diagnostics (and their time) only on steps 2 and 4
    assert [("actor/kl_ref" in r, r["diagnose_s"] > 0) for r in rows] == [(False, False), (True, True)] * 2
    assert all(r["actor/samples_used"] > 0 or r["actor/updated"] == 0 for r in rows)
    with pytest.raises(ValueError, match="--diagnose-every"):
        TrainConfig(diagnose_every=-1).check()
    with pytest.raises(ValueError, match="--grad-checkpointing must be one of"):
        TrainConfig(grad_checkpointing="yes").check()


def test_one_crl_step_end_to_end_with_checkpoint_resume_and_config_refusal(tiny, tmp_path):
    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "crl", "--model", tiny, "--dtype", "float32",
            "--groups", "1", "--group-size", "4", "--eval-episodes", "4", "--eval-every", "1", "--embedder", "hash",
            "--extractor-warmup", "1", "--extractor-batch", "1", "--lora-rank", "4", "--distil-workers", "2",
            "--dynamic-sampling", "0",  # the paper's algorithm: exactly the scheduled episodes are distilled
            "--agent-arg", "max_tool_calls=0", "--agent-arg", 'manager_config={"merge_threshold": 0.95}']
    assert main([*args, "--steps", "1"]) == 0
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["episodes"] == 4 and "train_success_with_experience" in row and "bank_entries" in row
    assert row["bank_s"] > 0 and row["extractor_wait_s"] >= 0  # the flush, timed apart from the rollouts
    evals = [json.loads(x) for x in (tmp_path / "evals.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 1] and "with_experience" in evals[-1]
    assert (tmp_path / "checkpoint.pt").exists() and (tmp_path / "extractor_calls.jsonl").exists()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = EventAccumulator(str(tmp_path / "tb")).Reload().Tags()["scalars"]
    assert {"train/train_success", "train/actor/clip_fraction", "train/bank_entries", "heldout/success",
            "heldout/with_experience"} <= set(tags), tags
    # resume continues from the checkpoint (a run may be extended); another config is refused, naming the field
    with pytest.raises(SystemExit, match="exists"):
        main([*args, "--steps", "2"])
    assert main([*args, "--steps", "2", "--resume"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["extractor/merges"] == 0 and rows[1]["extractor/merges"] == 1  # --merge-every 1: before step 2
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["agent_args"] == {"max_tool_calls": 0, "manager_config": {"merge_threshold": 0.95}} and saved["distil_workers"] == 2
    with pytest.raises(SystemExit, match="lr"):
        main([*args, "--steps", "3", "--resume", "--lr", "0.5"])
    with pytest.raises(SystemExit, match="agent_args"):
        main([*args, "--steps", "3", "--resume", "--agent-arg", "max_tool_calls=1"])
    # held-out evaluation episodes (16 here) are never distilled: only the 2 x 4 training episodes are
    calls = [json.loads(x) for x in (tmp_path / "extractor_calls.jsonl").read_text().splitlines()]
    distilled = [c for c in calls if c.get("type") == "call" and c.get("kind") == "distil"]
    assert 0 < len(distilled) <= 8, len(distilled)


@pytest.mark.parametrize("beside", [1, 0])
def test_the_extractor_update_runs_beside_the_rollouts_and_no_distillation_runs_meanwhile(tiny, tmp_path, monkeypatch,
                                                                                           beside):
    import time

    import crl_agent.train as tr
    from crl_agent.experience import ExperienceManager
    from crl_agent.experience import extractor as ex
    from crl_agent.rl.learner import PolicyLearner

    in_play, overlapped, distilled_while_paused = [0], [], []
    real_play, real_update, real_distil = tr.play, PolicyLearner.update, ExperienceManager.distil

    async def play(*a, **k):
        in_play[0] += 1
        try:
            return await real_play(*a, **k)
        finally:
            in_play[0] -= 1

    def update(self, samples, weight=None):
        if self.loss == "cispo":  # the extractor's update, on its backend's thread: are rollouts in flight?
            deadline = time.monotonic() + (30 if beside else 1)
            while not in_play[0] and time.monotonic() < deadline:
                time.sleep(0.01)
            overlapped.append(in_play[0] > 0)
        return real_update(self, samples, weight)

    async def distil(self, traj):
        distilled_while_paused.append(self.extractor_paused)
        return await real_distil(self, traj)

    def parse_distil(text, valid_ids):  # the tiny model's reply read as a valid entry
        i = next(numbers)
        reply = {"operations": [{"op": "add", "title": f"Door {i}", "content": f"If door {i} is shut, then try it."}]}
        return real_parse(json.dumps(reply), valid_ids)

    real_parse, numbers = ex.parse_distil, itertools.count()
    monkeypatch.setattr(tr, "play", play)
    monkeypatch.setattr(PolicyLearner, "update", update)
    monkeypatch.setattr(ExperienceManager, "distil", distil)
    monkeypatch.setattr(ex, "parse_distil", parse_distil)
    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "crl", "--model", tiny, "--dtype", "float32",
            "--groups", "1", "--group-size", "8", "--eval-episodes", "2", "--eval-every", "0", "--embedder", "hash",
            "--extractor-warmup", "1", "--extractor-batch", "2", "--lora-rank", "4", "--steps", "5",
            "--extractor-async", str(beside), "--agent-arg", "max_tool_calls=0", "--explore", "0.5", "--seed", "3"]
    assert main(args) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # step 1 writes entries, step 2's episodes use them (meta-rewards), later steps launch an update at their start
    # once two ready calls earned different rewards (the actor explores, so the episodes an entry guides do not
    # all end alike)
    updated = [r["step"] for r in rows if "extractor/wait_s" in r]
    assert len(updated) >= 2 and min(updated) >= 3, rows
    assert all(r["extractor/samples"] >= 2 for r in rows if r["step"] in updated)
    assert rows[-1]["extractor/valid_rate"] == 1.0  # every (parsed) reply was a valid operation
    # the meta-reward so far, every step: none before step 2's episodes use step 1's entries
    from crl_agent.experience.calllog import load_samples

    assert rows[0]["extractor/rewarded_calls"] == 0 and "extractor/meta_reward" not in rows[0]
    rewarded = [x.reward for x in load_samples(tmp_path / "extractor_calls.jsonl") if x.reward is not None]
    assert rows[-1]["extractor/rewarded_calls"] == len(rewarded) > 0
    assert rows[-1]["extractor/meta_reward"] == pytest.approx(sum(rewarded) / len(rewarded))
    assert overlapped == [bool(beside)] * len(updated)  # beside: the step's rollouts ran while the extractor trained
    assert distilled_while_paused and not any(distilled_while_paused)  # the bank stayed fenced meanwhile
    calls = [json.loads(x) for x in (tmp_path / "extractor_calls.jsonl").read_text().splitlines()]
    assert [c["step"] + 1 for c in calls if c.get("type") == "trained"] == updated  # recorded at the step's index


def test_exported_adapters_load_into_a_backend_and_reproduce_the_trained_policy(tiny, tmp_path):
    from crl_agent.llm import make_llm
    from crl_agent.rl import add_lora, load_checkpoint

    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "grpo", "--model", tiny, "--dtype", "float32",
            "--groups", "2", "--group-size", "4", "--eval-episodes", "2", "--eval-every", "0", "--lora-rank", "4",
            "--lr", "0.05", "--steps", "3", "--score-norm", "mean"]
    assert main(args) == 0
    assert any(json.loads(x)["actor/updated"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines())
    adapter = tmp_path / "adapters" / "actor"
    assert (adapter / "adapter_config.json").is_file()
    messages = [{"role": "user", "content": "Which door? red, blue, green or yellow"}]
    doors = ["red", "blue", "green", "yellow"]

    async def scores(llm):
        try:
            return (await llm.score_full(messages, doors)).logprobs
        finally:
            await llm.aclose()

    trained = asyncio.run(scores(make_llm("transformers", tiny, dtype="float32", adapter=str(adapter))))
    base = asyncio.run(scores(make_llm("transformers", tiny, dtype="float32")))
    # the same weights rebuilt from the checkpoint (base + LoRA + saved adapter state), unmerged
    ref = make_llm("transformers", tiny, dtype="float32")
    model = add_lora(ref.model, r=4)
    load_checkpoint(tmp_path / "checkpoint.pt", models={"actor": model})
    expected = asyncio.run(scores(ref))
    assert trained == pytest.approx(expected, abs=1e-3)
    assert max(abs(a - b) for a, b in zip(trained, base, strict=True)) > 1e-3  # training changed the policy
    with pytest.raises(Exception, match="adapter_config.json"):
        make_llm("transformers", tiny, dtype="float32", adapter=str(tmp_path))


def test_agent_args_reach_the_agent_and_the_eval_command_and_trainer_owned_ones_are_refused(tiny, tmp_path, capsys):
    from crl_agent.train import eval_command

    base = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--model", tiny, "--dtype", "float32", "--steps", "1"]
    for bad, why in ((["--agent-arg", "temperature=0.5"], "set by the trainer"),
                     (["--agent-arg", "no-key"], "KEY=VALUE"),
                     (["--agent-arg", "manager_config=[1]", "--mode", "crl"], "JSON object"),
                     (["--agent-arg", "not_an_option=1", "--lora-rank", "4", "--eval-every", "0"], "not_an_option")):
        with pytest.raises(SystemExit) as e:
            main([*base, *bad])
        assert e.value.code == 2 and why in capsys.readouterr().err, bad
    cfg = TrainConfig(tasks=DOORS, mode="crl", distil_max_tokens=96, distil_workers=4,
                      agent_args={"max_tool_calls": 0, "manager_config": {"merge_threshold": 0.95}})
    cmd = eval_command(cfg, tmp_path)
    assert "--agent-arg max_tool_calls=0" in cmd
    manager = json.loads(cmd.split("manager_config='")[1].split("'")[0])
    # the trainer's distillation settings and the user's additions; merges back on the manager's own schedule
    assert manager == {"distil_params": {"max_tokens": 96, "temperature": 0.7}, "max_trajectory_chars": 8000,
                       "distil_workers": 4, "merge_threshold": 0.95}


def test_distil_per_group_picks_that_many_rollouts_of_each_group_alternating_halves():
    import random

    from crl_agent.train import distil_choice

    every = distil_choice(TrainConfig(mode="crl", groups=2, group_size=8), random.Random(0))
    assert every == {(g, k) for g in range(2) for k in range(8)}  # default: all, as the official code
    for n in (1, 2, 3, 5):
        picked = distil_choice(TrainConfig(mode="crl", groups=3, group_size=8, distil_per_group=n), random.Random(n))
        for g in range(3):
            ks = [k for gg, k in picked if gg == g]
            assert len(ks) == n and len([k for k in ks if k < 4]) == (n + 1) // 2, (n, ks)  # without experience first
    draws = {frozenset(distil_choice(TrainConfig(mode="crl", groups=1, group_size=8, distil_per_group=2),
                                     random.Random(i))) for i in range(20)}
    assert len(draws) > 5  # a random subset, not always the same rollouts
    with pytest.raises(ValueError, match="distil-per-group"):
        TrainConfig(mode="crl", group_size=4, distil_per_group=5).check()


def test_a_crl_step_with_distil_per_group_distils_only_that_many_episodes(tiny, tmp_path):
    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "crl", "--model", tiny, "--dtype", "float32",
            "--groups", "2", "--group-size", "4", "--eval-episodes", "1", "--eval-every", "0", "--embedder", "hash",
            "--lora-rank", "4", "--distil-max-tokens", "16", "--distil-per-group", "1", "--steps", "2",
            "--dynamic-sampling", "0", "--agent-arg", "max_tool_calls=0"]
    assert main(args) == 0
    calls = [json.loads(x) for x in (tmp_path / "extractor_calls.jsonl").read_text().splitlines()]
    distilled = [c for c in calls if c.get("type") == "call" and c.get("kind") == "distil"]
    assert len(distilled) == 4, len(distilled)  # 2 steps x 2 groups x 1, of 16 training episodes
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["episodes"] == 8 for r in rows)


def _episode(turns: int):
    from crl_agent.episode import Episode, ScoredTurn, Step

    scored = ScoredTurn(candidates=["a", "b"], logprobs=[-1.0, -2.0], probs=[0.73, 0.27], chosen=0, action_logprob=-1.0,
                        behaviour_logprob=-1.0, temperature=1.0, score_norm="sum", policy_version=0,
                        prompt_token_ids=[1, 2], candidate_token_ids=[[3], [4]])
    steps = [Step(t, "obs", ["a", "b"], "a", 0.0, True, False, False, False, 0.0, turn=scored.trace(), scored=scored)
             for t in range(turns)]
    return Episode("test/Doors-v0", 0, steps=steps)


def test_turn_samples_weigh_episodes_equally_or_turns_equally_and_subsample_without_bias():
    import random

    from crl_agent.rl import turn_samples

    eps, adv = [_episode(1), _episode(3)], [1.0, -1.0]
    # every sample carries its episode's advantage; the weighting is its loss coefficient alone
    by_episode = turn_samples(eps, adv, "episode")
    assert [s.advantage for s in by_episode.samples] == [1.0, -1.0, -1.0, -1.0]
    assert [s.coef for s in by_episode.samples] == pytest.approx([1.0, 1 / 3, 1 / 3, 1 / 3])  # 1 per episode
    assert by_episode.loss_weight == 2  # ranks combine by the coefficients' sum: the episodes
    by_turn = turn_samples(eps, adv, "turn")
    assert [s.coef for s in by_turn.samples] == [1.0, 1.0, 1.0, 1.0]  # every turn the same:
    assert by_turn.loss_weight == 4  # the long episode dominates
    # 2 of 3 turns kept from the long episode: each kept turn carries 1/2 of that episode's 1
    sub = turn_samples(eps, adv, "episode", per_episode=2, rng=random.Random(0)).samples
    assert [s.coef for s in sub] == pytest.approx([1.0, 0.5, 0.5])
    sub = turn_samples(eps, adv, "turn", per_episode=2, rng=random.Random(0)).samples
    assert sum(s.coef * s.advantage for s in sub) / 4 == pytest.approx((1.0 - 3.0) / 4)  # unbiased for the turn mean
    with pytest.raises(ValueError, match="turn weighting"):
        turn_samples(eps, adv, "token")


def test_a_trainer_killed_at_a_random_point_reopens_consistent_and_resumes(tiny, tmp_path):
    """kill -9 during a crl run: the checkpoint, the bank and the call log reopen; --resume finishes the run
    and the metrics hold each step once."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from crl_agent.experience import ExperienceBank
    from crl_agent.experience.calllog import read_records
    from crl_agent.rl import load_checkpoint

    out = tmp_path / "run"
    args = ["--out", str(out), "--quiet", "--tasks", DOORS, "--mode", "crl", "--model", tiny, "--dtype", "float32",
            "--groups", "2", "--group-size", "4", "--eval-episodes", "4", "--eval-every", "3", "--embedder", "hash",
            "--extractor-warmup", "1", "--extractor-batch", "2", "--lora-rank", "4", "--score-norm", "mean",
            "--distil-max-tokens", "24", "--threads", "1"]
    script = ("import sys, gymnasium as gym; gym.register(sys.argv[1], entry_point='tests.test_rl_bandit:DoorEnv', "
              "max_episode_steps=1); from crl_agent.train import main; sys.exit(main(sys.argv[2:]))")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", script, DOORS, *args, "--steps", "200"], cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)})
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint.pt").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (out / "checkpoint.pt").exists(), "no checkpoint within 120 s"
        time.sleep(random.Random(os.getpid()).uniform(0.0, 2.0))  # anywhere in a later step
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    ck = load_checkpoint(out / "checkpoint.pt")
    assert ck.step >= 1
    ExperienceBank(out / "experience_bank", embedder="hash").close()  # the dead process's lock is gone
    read_records(out / "extractor_calls.jsonl")  # a torn last line is skipped, not an error
    assert main([*args, "--steps", str(ck.step + 2), "--resume"]) == 0
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, ck.step + 3)), steps
    evals = [json.loads(x)["step"] for x in (out / "evals.jsonl").read_text().splitlines()]
    assert evals == sorted(set(evals)) and evals[-1] == ck.step + 2
    ExperienceBank(out / "experience_bank", embedder="hash").close()  # and the resumed run released it


class _ServedElsewhere:
    """A backend that does not share the learner's weights (as vLLM): it only gets adapter folders."""

    def __init__(self):
        self.loaded: list[tuple[str, int | None, list[str]]] = []

    def load_adapter(self, path, version=None):
        import os

        self.loaded.append((path, version, sorted(os.listdir(path))))


def test_a_backend_that_does_not_share_the_weights_gets_each_update_as_an_exported_adapter(tiny, tmp_path):
    from crl_agent.llm import make_llm
    from crl_agent.rl import ExportedAdapter, PolicyLearner, TurnSample, add_lora
    from crl_agent.train import update

    llm = make_llm("transformers", tiny, dtype="float32")
    learner = PolicyLearner(add_lora(llm.model, r=4), lr=1e-2)
    ids = llm.render([{"role": "user", "content": "pick"}])
    cands = [llm.candidate_ids(c) for c in ("red", "blue")]
    samples = [TurnSample(prompt_ids=ids, advantage=a, old_logprobs=[-0.7], candidate_ids=cands, chosen=k)
               for k, a in ((0, 1.0), (1, -1.0))]
    served = _ServedElsewhere()
    sync = ExportedAdapter(served, tmp_path / "sync")
    metrics = asyncio.run(update(sync, learner, samples))
    assert metrics["updated"] == 1 and learner.version == 1
    assert served.loaded == [(str(tmp_path / "sync"), 1, served.loaded[0][2])]
    assert "adapter_config.json" in served.loaded[0][2]
    assert asyncio.run(update(sync, learner, [])) == {} and len(served.loaded) == 1
    # PPO epochs: three updates on one batch, one sync; later epochs see the ratio move off 1
    import dataclasses

    fresh = [dataclasses.replace(x, policy_version=learner.version) for x in samples]
    metrics = asyncio.run(update(sync, learner, fresh, epochs=3))
    assert (metrics["updated"], metrics["epochs"], learner.version) == (3, 3, 4)
    assert served.loaded[-1][1] == 4 and len(served.loaded) == 2
    assert metrics["stale"] == 0 and metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-6)
    asyncio.run(llm.aclose())


# ------------------------------------------------------------------ envs in worker processes
CRASHY = "test/CrashOnceDoors-v0"
if CRASHY not in gym.registry:
    gym.register(CRASHY, entry_point="tests.test_train:CrashOnceDoorEnv", max_episode_steps=1)


class CrashOnceDoorEnv(DoorEnv):
    """The bandit, but the first reset on seed 0 kills its own process (as a native env that segfaults);
    ``$CRL_TEST_CRASH_MARK`` records that it happened, so the restarted worker plays on."""

    def reset(self, *, seed=None, options=None):
        mark = os.environ.get("CRL_TEST_CRASH_MARK")
        if seed == 0 and mark and not os.path.exists(mark):
            open(mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().reset(seed=seed, options=options)


def test_envs_in_worker_processes_a_crashed_worker_errors_its_episodes_and_training_goes_on(tiny, tmp_path,
                                                                                              monkeypatch):
    mark = tmp_path / "crashed"
    monkeypatch.setenv("CRL_TEST_CRASH_MARK", str(mark))  # the spawned workers inherit it
    cfg = TrainConfig(tasks=CRASHY, mode="grpo", model=tiny, dtype="float32", steps=3, groups=2, group_size=4,
                      lr=3e-3, lora_rank=0, score_norm="mean", eval_every=0, eval_episodes=8, seed=0,
                      concurrency=4, num_workers=2, env_backend="process", dynamic_sampling=0)
    evals = asyncio.run(train(cfg, tmp_path / "run", quiet=True))
    assert mark.exists()  # a worker really died: on the first training group (seed 0)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert 1 <= rows[0]["errored"] < rows[0]["episodes"] == 8  # its episodes errored; the rest trained
    assert rows[0]["actor/samples"] == 8 - rows[0]["errored"]
    assert rows[1]["errored"] == rows[2]["errored"] == 0  # the worker was restarted
    assert evals[0]["errored"] == evals[-1]["errored"] == 0 and len(evals) == 2
    # where envs run is not part of what the run learns from: a resume may move them in-process
    more = dataclasses.replace(cfg, steps=4, num_workers=0)
    asyncio.run(train(more, tmp_path / "run", resume=True, quiet=True))
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 4


# ------------------------------------------------------------------ static mode, several tasks, the extractor's model
STATIC = ["--tasks", DOORS, "--mode", "static", "--dtype", "float32", "--groups", "1", "--group-size", "4",
          "--eval-episodes", "4", "--eval-every", "1", "--embedder", "hash", "--extractor-warmup", "0",
          "--extractor-batch", "1", "--lora-rank", "4", "--distil-workers", "2", "--distil-max-tokens", "32",
          "--agent-arg", "max_tool_calls=0"]


def test_static_mode_grows_the_bank_online_but_never_trains_the_extractor(tiny, tmp_path):
    from crl_agent.train import eval_command

    args = ["--out", str(tmp_path), "--quiet", "--model", tiny, *STATIC]
    assert main([*args, "--steps", "2"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # split groups as in crl: half of each group with experience, the bank distilled online
    assert all(r["episodes"] == 4 and "train_success_with_experience" in r for r in rows)
    assert rows[-1]["extractor/distillations"] > 0
    calls = [json.loads(x) for x in (tmp_path / "extractor_calls.jsonl").read_text().splitlines()]
    assert any(c.get("type") == "call" and c.get("kind") == "distil" for c in calls)
    # warm-up 0 and a batch of 1 would train a crl extractor at once; a static one never is
    assert not any(k.startswith("extractor/loss") or k == "extractor/reward" for r in rows for k in r)
    assert not (tmp_path / "adapters" / "extractor").exists() and (tmp_path / "adapters" / "actor").exists()
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert set(ck["models"]) == set(ck["learners"]) == {"actor"} and ck["config"]["mode"] == "static"
    evals = [json.loads(x) for x in (tmp_path / "evals.jsonl").read_text().splitlines()]
    assert all("with_experience" in e for e in evals)
    cmd = eval_command(TrainConfig(tasks=DOORS, mode="static"), tmp_path)
    assert "--agent crl" in cmd and "extractor_adapter" not in cmd and "--bank" in cmd
    assert main([*args, "--steps", "3", "--resume"]) == 0
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_several_tasks_share_the_steps_groups_and_each_is_evaluated(tiny, tmp_path):
    both = f"{DOORS},{CRASHY}"  # (no crash mark set: the second is the same bandit under another id)
    args = ["--out", str(tmp_path), "--quiet", "--tasks", both, "--mode", "grpo", "--model", tiny, "--dtype", "float32",
            "--groups", "2", "--group-size", "4", "--eval-episodes", "6", "--eval-every", "0", "--lora-rank", "4",
            "--concurrency", "4", "--steps", "2"]
    assert main(args) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for r in rows:  # one group of each task a step
        assert r["episodes"] == 8 and {f"train_success/{DOORS}", f"train_success/{CRASHY}"} <= set(r)
        assert r["train_success"] == pytest.approx((r[f"train_success/{DOORS}"] + r[f"train_success/{CRASHY}"]) / 2)
    for e in (json.loads(x) for x in (tmp_path / "evals.jsonl").read_text().splitlines()):
        assert e["success"] == pytest.approx((e[f"success/{DOORS}"] + e[f"success/{CRASHY}"]) / 2)
        assert e["errored"] == 0 and f"success_se/{CRASHY}" in e
    from crl_agent.train import eval_command

    assert f"--tasks {both} --episodes 6" in eval_command(TrainConfig(tasks=both), tmp_path)


def test_task_sets_resolve_as_in_eval_and_an_unknown_task_is_a_clear_error(capsys, tmp_path):
    from crl_envs.task_sets import TASK_SETS

    assert TrainConfig(tasks="6").task_ids == list(TASK_SETS["6"])
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path), "--quiet", "--tasks", f"{DOORS},crl/Sokoban-6x6-9-v0", "--steps", "1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "crl/Sokoban-6x6-9-v0" in err and "Did you mean" in err
    assert not (tmp_path / "checkpoint.pt").exists()
    # the one-task spelling of earlier versions still works
    args = build_parser().parse_args(["--out", "x", "--env", DOORS])
    assert args.tasks == DOORS


def test_the_extractor_runs_on_its_own_model_and_grpo_refuses_one(tiny, tmp_path, capsys):
    from crl_agent.train import build, eval_command

    other = str(build_tiny_chat_model(tmp_path / "other", seed=1))
    cfg = TrainConfig(tasks=DOORS, mode="crl", model=tiny, extractor_model=other, dtype="float32", lora_rank=4,
                      embedder="hash", agent_args={"max_tool_calls": 0}, extractor_max_batch=12,
                      grad_checkpointing="extractor")
    setup = build(cfg, tmp_path / "run")
    llm, agent, extractor, ext_learner = setup.llm, setup.agent, setup.extractor, setup.extractor_learner
    try:
        # --extractor-max-batch sizes the extractor's engine (answers join its batches up to it), not the actor's
        assert extractor.max_batch_size == extractor._engine.max_rows == 12 and llm.max_batch_size == 8
        # --grad-checkpointing extractor: only the extractor's learner recomputes its activations
        assert ext_learner.gradient_checkpointing and not setup.learner.gradient_checkpointing
        from transformers import AutoModelForCausalLM

        def embedding(model):  # whatever the LoRA wrapper's prefix
            return next(p for n, p in model.named_parameters() if n.endswith("embed_tokens.weight"))

        torch.testing.assert_close(embedding(extractor.model), embedding(AutoModelForCausalLM.from_pretrained(other)))
        assert not torch.equal(embedding(extractor.model), embedding(llm.model))
        # the bank's extractor is that model, and its learner trains it (not the actor's weights)
        assert agent.manager.extractor is extractor and embedding(ext_learner.model) is embedding(extractor.model)
    finally:
        asyncio.run(agent.aclose())
        asyncio.run(extractor.aclose())
    assert f"--extractor-model {other}" in eval_command(cfg, tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "g"), "--quiet", "--tasks", DOORS, "--mode", "grpo", "--extractor-model", other])
    assert e.value.code == 2 and "--extractor-model is for --mode crl or static" in capsys.readouterr().err


def test_rollout_stats_and_tokens_count_tool_choices():
    """A turn that chose to search scored twice: both decisions count toward entropy, tokens and the tool rate."""
    import math

    from crl_agent.episode import Episode, ScoredTurn, Step
    from crl_agent.train_report import rollout_stats, rollout_tokens

    def decision(probs, chosen):
        return ScoredTurn(candidates=[f"c{i}" for i in range(len(probs))], logprobs=[math.log(max(p, 1e-9)) for p in probs],
                          probs=probs, chosen=chosen, action_logprob=math.log(probs[chosen]),
                          behaviour_logprob=math.log(probs[chosen]), temperature=1.0, score_norm="sum",
                          policy_version=0, prompt_token_ids=[1, 2, 3], candidate_token_ids=[[4]] * len(probs))

    def step(t, scored, tools=()):
        return Step(t=t, observation="o", admissible_actions=["c0", "c1"], action="c0", reward=0.0, valid_action=True,
                    terminated=False, truncated=False, success=False, progress=0.0, scored=scored,
                    tool_choices=list(tools))

    search = decision([0.5, 0.5], 1)  # entropy log 2
    ep = Episode(env_id="e", seed=0, steps=[step(0, decision([1.0, 0.0], 0), [search]), step(1, decision([1.0, 0.0], 0))])
    stats = rollout_stats([ep])
    assert stats["rollout/tool_choice_rate"] == pytest.approx(1 / 3)
    assert stats["rollout/policy_entropy"] == pytest.approx(math.log(2) / 3)
    assert rollout_tokens([ep]) == 3 * (3 + 2)
