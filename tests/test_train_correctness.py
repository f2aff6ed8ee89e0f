"""Trainer correctness: configuration errors up front, usage errors only for configuration, the bank flushed
before held-out evaluations and checkpoints, a transactional resume of the experience side, the extractor's
samples (cooldown, policy version, the temperature they were sampled at)."""

from __future__ import annotations

import math

import pytest

from crl_agent.train import TrainConfig, main
from tests import test_train

# the trainer tests' bandit env; the tiny chat model and one torch thread come from tests/conftest.py
DOORS = test_train.DOORS
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan])
def test_a_temperature_that_is_not_positive_is_refused_before_the_run_starts(temperature):
    with pytest.raises(ValueError, match="--temperature must be > 0"):
        TrainConfig(temperature=temperature).check()
    TrainConfig(temperature=0.1).check()


@pytest.mark.parametrize("value", [True, "true"])
def test_an_episode_may_not_wait_for_its_own_steps_distillations(value):
    with pytest.raises(ValueError, match="sync_experience"):
        TrainConfig(mode="crl", agent_args={"sync_experience": value}).check()
    TrainConfig(mode="crl", agent_args={"sync_experience": False}).check()


# ------------------------------------------------------------------ usage errors: the configuration only
def test_a_value_error_deep_inside_training_keeps_its_traceback_and_is_no_usage_error(tiny, tmp_path, monkeypatch):
    import crl_agent.train as tr

    async def rollout(*args, **kwargs):
        raise ValueError("a bug deep inside training")

    monkeypatch.setattr(tr, "rollout", rollout)
    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--model", tiny, "--dtype", "float32", "--steps", "1",
            "--groups", "1", "--group-size", "2", "--eval-episodes", "1", "--eval-every", "0", "--lora-rank", "4"]
    with pytest.raises(ValueError, match="a bug deep inside training"):
        main(args)


class _TwoRanks:
    """What ``train`` sees of a two-process torchrun launch (it fails the launch check before anything else)."""

    world, rank, main = 2, 0, True

    def __init__(self, device="cpu"):
        self.device = device

    def close(self):
        pass


def test_configuration_errors_found_by_train_before_training_are_usage_errors(tmp_path, monkeypatch, capsys):
    import crl_agent.rl

    base = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--steps", "1"]
    # the options themselves (an unknown task is a TaskSetError), before train runs
    with pytest.raises(SystemExit) as e:
        main([*base[:3], "--tasks", "crl/No-Such-Task-v0"])
    assert e.value.code == 2 and "crl/No-Such-Task-v0" in capsys.readouterr().err
    # what train checks before training starts: the launch (check_world)
    monkeypatch.setattr(crl_agent.rl, "Distributed", _TwoRanks)
    with pytest.raises(SystemExit) as e:
        main([*base, "--groups", "1"])
    assert e.value.code == 2 and "at least the number of processes (2)" in capsys.readouterr().err
    assert not (tmp_path / "checkpoint.pt").exists()


# ------------------------------------------------------------------ the bank is flushed before evaluations and checkpoints
def test_held_out_evaluations_and_checkpoints_wait_for_the_steps_distillations(tiny, tmp_path, monkeypatch):
    import asyncio

    import crl_agent.rl
    import crl_agent.train as tr
    from crl_agent.experience import ExperienceManager

    real_distil, real_evaluate, real_save = ExperienceManager.distil, tr.evaluate, crl_agent.rl.save_checkpoint
    managers, pending_at_eval, pending_at_checkpoint, distilled = [], [], [], []

    async def distil(self, traj):  # a slow extractor: the step ends long before its distillations do
        await asyncio.sleep(0.5)
        distilled.append(traj.id)
        return await real_distil(self, traj)

    async def evaluate(cfg, pool, agent, step, dist=None, record=None):
        managers.append(agent.manager)
        pending_at_eval.append(agent.manager.pending)
        return await real_evaluate(cfg, pool, agent, step, dist)

    def save_checkpoint(*args, **kwargs):
        pending_at_checkpoint.append(managers[-1].pending)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(ExperienceManager, "distil", distil)
    monkeypatch.setattr(tr, "evaluate", evaluate)
    monkeypatch.setattr(crl_agent.rl, "save_checkpoint", save_checkpoint)
    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "static", "--model", tiny, "--dtype",
            "float32", "--steps", "2", "--groups", "1", "--group-size", "2", "--eval-episodes", "1", "--eval-every", "1",
            "--embedder", "hash", "--lora-rank", "4", "--distil-workers", "1", "--distil-max-tokens", "8",
            "--dynamic-sampling", "0", "--agent-arg", "max_tool_calls=0"]
    assert main(args) == 0
    assert len(distilled) == 4  # 2 steps x 2 training episodes (held-out ones are never distilled)
    assert pending_at_eval == [0, 0, 0] and pending_at_checkpoint == [0, 0]


# ------------------------------------------------------------------ one bank snapshot per step
def test_every_episode_of_a_step_searches_the_bank_flushed_before_it_and_the_steps_writes_land_after(tiny, tmp_path,
                                                                                                    monkeypatch):
    import asyncio
    import itertools
    import json

    import crl_agent.train as tr
    from crl_agent.episode import episode_key
    from crl_agent.experience import ExperienceManager
    from crl_agent.experience import extractor as ex

    real_play, real_search, real_parse = tr.play, ExperienceManager.search, ex.parse_distil
    numbers = itertools.count()
    window: list[set[str] | None] = [None]  # the keys of the episodes the running step plays
    windows: list[set[str]] = []
    searches: list[tuple[int, list[str]]] = []  # (step, the episodes each returned entry was distilled from)
    applied_in_rollouts = []

    async def play(pool, agent, ctxs):  # one episode after another, so later ones start after earlier ones end
        if window[0] is None:  # a held-out evaluation
            return await real_play(pool, agent, ctxs)
        window[0].update(episode_key(c.env_id, c.seed, c.sample) for c in ctxs)
        episodes = []
        for c in ctxs:
            if c.with_experience:  # give the step's distillations every chance to land first (as before the fix)
                for _ in range(40):
                    if not agent.manager.pending:
                        break
                    await asyncio.sleep(0.05)
            episodes += await real_play(pool, agent, [c])
        return episodes

    async def rollout(*args, **kwargs):
        window[0] = set()
        windows.append(window[0])
        try:
            return await real_rollout(*args, **kwargs)
        finally:
            window[0] = None

    async def search(self, query, k=None, task=None, record=True):
        entries = await real_search(self, query, k, task, record)
        searches.append((len(windows) if window[0] is not None else 0,
                         [s.split("@")[0] for e in entries for s in e.sources]))
        return entries

    def parse_distil(text, valid_ids):  # every distillation writes one entry
        applied_in_rollouts.append(window[0] is not None)
        i = next(numbers)
        reply = {"operations": [{"op": "add", "title": f"Door {i}", "content": f"If door {i} is shut, then try it."}]}
        return real_parse(json.dumps(reply), valid_ids)

    real_rollout = tr.rollout
    monkeypatch.setattr(tr, "play", play)
    monkeypatch.setattr(tr, "rollout", rollout)
    monkeypatch.setattr(ExperienceManager, "search", search)
    monkeypatch.setattr(ex, "parse_distil", parse_distil)
    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "static", "--model", tiny, "--dtype",
            "float32", "--steps", "2", "--groups", "1", "--group-size", "4", "--eval-episodes", "1", "--eval-every", "0",
            "--embedder", "hash", "--lora-rank", "4", "--distil-max-tokens", "8", "--concurrency", "1",
            "--dynamic-sampling", "0", "--agent-arg", "max_tool_calls=0"]
    assert main(args) == 0
    assert len(windows) == 2 and any(applied_in_rollouts)  # distillations ran while the step's episodes played
    step_searches = [(step, sources) for step, sources in searches if step]  # the held-out ones come after
    assert [step for step, _ in step_searches] == [1, 1, 2, 2]  # the with-experience half of each step
    for step, sources in step_searches:  # no episode saw a lesson drawn from its own step's episodes
        assert not set(sources) & windows[step - 1], (step, sources)
    # the writes of step 1 landed after its rollouts: step 2's episodes see them
    assert all(set(sources) & windows[0] for step, sources in step_searches if step == 2)


# ------------------------------------------------------------------ the extractor's samples
def test_the_extractor_batch_leaves_out_calls_in_cooldown_and_carries_the_version_that_sampled_them(tmp_path):
    import asyncio

    from crl_agent.experience import ExperienceBank, ExperienceManager, ManagerConfig
    from crl_agent.rl import extractor_samples
    from tests.test_experience_manager import TASK, VersionedLLM, add, ops, traj

    llm = VersionedLLM([ops(add("Corners", "If a box is in a corner, then restart.")), "Avoid the corners."])
    bank = ExperienceBank(tmp_path / "bank", embedder="hash")

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0))
        llm.set_policy_version(1)
        m.submit(traj(0))
        await m.flush()
        (corners,) = bank.entries()
        llm.set_policy_version(2)
        ans = await m.ask("what about corners?", task=TASK)
        m.record_outcome("ep1", [corners], True, call_ids=[ans.call_id])
        m.record_outcome("ep2", [corners], False)
        samples, used, *_ = extractor_samples(m, 4, cooldown=1, batch=2)
        assert [u.call_id for u in used] == [corners.origin, ans.call_id]
        assert [s.policy_version for s in samples] == [1, 2]  # the learner sees them as stale once it moved on
        m.mark_trained(used, step=4)
        m.record_outcome("ep3", [corners], True)  # new evidence for both
        m.record_outcome("ep4", [], False, call_ids=[ans.call_id])
        assert extractor_samples(m, 5, cooldown=1, batch=1)[:2] == ([], [])  # both cool down, the answer too
        samples, used, *_ = extractor_samples(m, 6, cooldown=1, batch=2)
        # each rewarded by its new outcome alone, weighted by (1 + times trained) ** -0.5
        assert [u.new_reward for u in used] == [1.0, -1.0] and [u.weight for u in used] == pytest.approx([2 ** -0.5] * 2)
        assert [s.advantage for s in samples] == pytest.approx([2 ** -0.5, -(2 ** -0.5)])
        await m.aclose()

    try:
        asyncio.run(main())
    finally:
        bank.close()


# ------------------------------------------------------------------ resume: the experience side goes back to the checkpoint
def test_resume_cuts_the_call_log_back_to_the_checkpoint_so_a_redone_step_counts_once(tiny, tmp_path):
    import json

    from crl_agent.rl import load_checkpoint

    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "static", "--model", tiny, "--dtype",
            "float32", "--groups", "1", "--group-size", "2", "--eval-episodes", "1", "--eval-every", "0",
            "--embedder", "hash", "--lora-rank", "4", "--distil-workers", "1", "--distil-max-tokens", "8",
            "--agent-arg", "max_tool_calls=0"]
    assert main([*args, "--steps", "1"]) == 0
    log = tmp_path / "extractor_calls.jsonl"
    saved = log.read_bytes()
    assert load_checkpoint(tmp_path / "checkpoint.pt").extra["call_log_offset"] == len(saved) > 0
    # a step 2 killed before its checkpoint: its call, the outcome it credited, a torn last line
    killed = [{"type": "call", "call_id": "killed-0", "kind": "distil", "messages": [], "entries": []},
              {"type": "outcome", "episode": f"{DOORS}#1#1", "outcome": 1.0, "call_ids": ["killed-0"]}]
    with log.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in killed) + '{"type": "outc')
    assert main([*args, "--steps", "2", "--resume"]) == 0
    after = log.read_bytes()
    assert after.startswith(saved) and b"killed-0" not in after
    records = [json.loads(x) for x in after.decode().splitlines()]  # no torn line left either
    assert any(r["type"] == "call" for r in records[len(saved.splitlines()):])  # step 2 redone, logged once
    assert load_checkpoint(tmp_path / "checkpoint.pt").extra["call_log_offset"] == len(after)


# ------------------------------------------------------------------ the extractor's old log-probs: the distribution sampled
def _distilled(tiny, tmp_path, monkeypatch):
    """A real distillation by the tiny transformers extractor at the trainer's settings (temperature 0.7),
    credited once, as the extractor's CISPO batch sees it: (the extractor, its one TurnSample)."""
    import asyncio

    from crl_agent.experience import ExperienceBank, ExperienceManager, ManagerConfig
    from crl_agent.experience import extractor as ex
    from crl_agent.llm import make_llm
    from crl_agent.llm.base import SamplingParams
    from crl_agent.rl import extractor_samples
    from crl_agent.train import manager_settings
    from tests.test_experience_manager import add, ops, traj

    real_parse = ex.parse_distil
    # whatever the tiny model wrote is read as one valid entry, so that an episode can credit it (120 tokens: the
    # tiny model's tokens are characters, and '{"operations": [{"op": "' is the schema's, not the model's choice)
    monkeypatch.setattr(ex, "parse_distil", lambda text, ids: real_parse(ops(add("Doors", "If shut, try it.")), ids))
    params = SamplingParams(**manager_settings(TrainConfig(mode="crl", distil_max_tokens=120))["distil_params"])
    assert params.temperature == 0.7
    llm = make_llm("transformers", tiny, dtype="float32", seed=0)
    bank = ExperienceBank(tmp_path / "bank", embedder="hash")

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0, distil_params=params))
        await m.distil(traj(0))
        (first,) = bank.entries()
        await m.distil(traj(1))  # a second call that fails: a batch needs two different rewards
        m.record_outcome("ep", [first], True)
        m.record_outcome("ep2", [e for e in bank.entries() if e.id != first.id], False)
        samples, *_ = extractor_samples(m, 1, cooldown=1, batch=2)
        await m.aclose()
        return samples

    try:
        sample, _ = asyncio.run(main())
    finally:
        bank.close()
    return llm, sample


def test_a_distillation_sampled_at_0_7_records_the_log_probs_the_learner_recomputes_at_0_7(tiny, tmp_path,
                                                                                           monkeypatch):
    import asyncio

    import torch

    from crl_agent.rl import batch_sequence_logprobs

    llm, sample = _distilled(tiny, tmp_path, monkeypatch)
    try:
        assert sample.mode == "generate" and sample.temperature == 0.7 and 0 < len(sample.response_ids) <= 120
        assert any(sample.response_mask) and not all(sample.response_mask)  # the forced tokens are masked
        old = torch.tensor(sample.old_logprobs)
        with torch.no_grad():
            (at_its_own,), _ = batch_sequence_logprobs(llm.model, [sample.prompt_ids], [sample.response_ids],
                                                       [sample.temperature])
            (unmodified,), _ = batch_sequence_logprobs(llm.model, [sample.prompt_ids], [sample.response_ids])
        # CISPO's first-epoch ratio pi(token) / pi_old(token) is 1 at every token
        torch.testing.assert_close((at_its_own - old).exp(), torch.ones_like(old), atol=1e-3, rtol=0)
        # the unmodified model's log-probs (what was recorded before) are another distribution: a biased ratio
        assert (unmodified - old).abs().max() > 1e-2
    finally:
        asyncio.run(llm.aclose())


def test_the_extractor_learners_first_epoch_ratio_on_a_distillation_sampled_at_0_7_is_1(tiny, tmp_path, monkeypatch):
    import asyncio
    import dataclasses

    from crl_agent.rl import PolicyLearner, add_lora

    llm, sample = _distilled(tiny, tmp_path, monkeypatch)
    try:
        learner = PolicyLearner(add_lora(llm.model, r=4), loss="cispo", lr=1e-4)  # as build() makes it
        # (a batch of one call has advantage 0: give it one, so that the learner runs its forward)
        metrics = learner.update([dataclasses.replace(sample, advantage=1.0)])
        assert metrics["updated"] == 1 and metrics["clip_fraction"] == 0.0
        assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
        assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-3)
    finally:
        asyncio.run(llm.aclose())
