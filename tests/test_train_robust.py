"""Robust learning: per-step diagnostics, DAPO-style dynamic sampling, the KL / entropy terms, and the
importance correction of explored turns."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from crl_agent.rl import PolicyLearner, TurnSample, add_lora  # noqa: E402
from crl_agent.train import TrainConfig, train  # noqa: E402
from tests.test_rl_bandit import DoorEnv  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny and one_thread: tests/conftest.py
RARE = "test/RareDoor-v0"


class RareDoorEnv(DoorEnv):
    """One step among twelve doors, one of which (``d0``) leads out: a random policy wins 1 time in 12,
    so a group of 4 rollouts fails whole about 70% of the time."""

    DOORS = tuple(f"d{i}" for i in range(12))
    winner = "d0"


if RARE not in gym.registry:
    gym.register(RARE, entry_point="tests.test_train_robust:RareDoorEnv", max_episode_steps=1)


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _run(tiny, out, **kw):
    cfg = TrainConfig(tasks=RARE, mode="grpo", model=tiny, dtype="float32", groups=1, group_size=4, lr=1e-3,
                      lora_rank=4, score_norm="mean", eval_every=0, eval_episodes=2, concurrency=8, seed=0,
                      diagnose_every=1, **kw)
    asyncio.run(train(cfg, out, quiet=True))
    return _rows(out / "metrics.jsonl")


def test_dynamic_sampling_restores_signal_when_the_scheduled_groups_all_fail(tiny, tmp_path):
    plain = _run(tiny, tmp_path / "plain", steps=4, dynamic_sampling=0)  # the paper's algorithm
    dapo = _run(tiny, tmp_path / "dapo", steps=4, dynamic_sampling=8)
    # the same scheduled groups (same seeds) in both runs until the first update that differs
    assert plain[0]["train_success"] == dapo[0]["train_success"]
    failed = [r for r in plain if r["signal_groups"] == 0]
    assert failed, "the rare-door env should fail a whole group of 4 at least once in 4 steps"
    for r in failed:  # without dynamic sampling: no signal, no gradient, no update
        assert r["actor/updated"] == 0 and r["actor/samples_used"] == 0 and r["extra_groups"] == 0
    rescued = [r for r in dapo if r["signal_groups"] == 0]
    assert rescued
    for r in rescued:  # with it: fresh groups played until one has mixed outcomes, and the step learns from it
        assert 1 <= r["extra_groups"] <= 8
        assert r["signal_halves_batch"] == 1.0 and r["actor/updated"] == 1 and r["actor/samples_used"] > 0
    for r in dapo:  # the update only ever sees groups with signal; a step with signal of its own plays nothing more
        assert r["signal_halves_batch"] == 1.0 or r["extra_groups"] == 8
        assert r["signal_halves"] == r["signal_groups"]  # grpo: a group is one half
        if r["signal_groups"] == 1:
            assert r["extra_groups"] == 0
    # the diagnostics the issue asks for, every step
    for r in plain + dapo:
        assert 0 < r["rollout/policy_entropy"] <= math.log(12) + 1e-6
        assert {"rollout/repeat_rate", "rollout/invalid_rate", "actor/clip_fraction"} <= set(r)
    assert plain[0]["actor/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # LoRA starts as the untrained model
    assert any(r["actor/kl_ref"] > 1e-6 for r in plain[1:] if plain[0]["actor/updated"])


def test_dynamic_sampling_drops_a_half_whose_outcomes_are_all_alike_and_reports_the_share_of_halves(monkeypatch):
    import crl_agent.train as tr
    from crl_agent.episode import Episode

    # (group, sample) -> success; samples 0-1 play without experience, 2-3 with it
    wins = {(0, 0), (2, 1), (2, 2)}  # group 0: only its half without experience is mixed; group 1: all fail;
    # group 2 (added by dynamic sampling): both halves mixed

    async def play(pool, agent, ctxs):
        return [Episode(c.env_id, c.seed, c.sample, success=(c.episode_index, c.sample) in wins) for c in ctxs]

    class OneRank:
        rank, world, main = 0, 1, True

        def share(self, n):
            return list(range(n))

    monkeypatch.setattr(tr, "play", play)
    cfg = TrainConfig(tasks=RARE, mode="static", groups=2, group_size=4, dynamic_sampling=1)
    batch = asyncio.run(tr.rollout(cfg, None, object(), 0, OneRank()))
    assert batch.extra_groups == 1  # 1 half of 4 had signal: one more group (at most --dynamic-sampling)
    # the all-alike halves are not in the batch (group 0 with experience, all of group 1)
    assert sorted({(c.episode_index, c.with_experience) for c in batch.contexts}) == [(0, False), (2, False),
                                                                                      (2, True)]
    assert len(batch.contexts) == 6 and all(e.success == ((c.episode_index, c.sample) in wins)
                                            for c, e in zip(batch.contexts, batch.episodes, strict=True))
    assert batch.signal_groups == 0.5 and batch.signal_scheduled == 0.25 and batch.signal_batch == 1.0
    assert len(batch.scheduled[0]) == 8  # train_success is still measured on every scheduled episode
    # without dynamic sampling nothing is dropped, and the batch's share is the scheduled one
    plain = asyncio.run(tr.rollout(dataclasses.replace(cfg, dynamic_sampling=0), None, object(), 0, OneRank()))
    assert len(plain.contexts) == 8 and plain.extra_groups == 0 and plain.signal_batch == 0.25


def test_held_out_halves_play_through_the_pool_at_once_and_are_scored_apart(monkeypatch, tmp_path):
    import crl_agent.train as tr
    from crl_agent.episode import Episode

    calls = []

    async def play(pool, agent, ctxs):  # seeds below 1_000_002 win with experience, none without
        calls.append(list(ctxs))
        return [Episode(c.env_id, c.seed, c.sample, success=c.with_experience and c.seed < 1_000_002, actions=3)
                for c in ctxs]

    monkeypatch.setattr(tr, "play", play)
    cfg = TrainConfig(tasks=RARE, mode="crl", eval_episodes=4)
    row = asyncio.run(tr.evaluate(cfg, None, object(), 8, record=tmp_path))
    assert len(calls) == 1 and len(calls[0]) == 8  # one pool run: both halves' episodes together
    assert [c.with_experience for c in calls[0]] == [False] * 4 + [True] * 4
    assert all(not c.learning and c.explore == 0.0 for c in calls[0])
    assert row["success"] == 0.0 and row["with_experience"] == 0.5 and row["mean_actions_with_experience"] == 3
    assert (tmp_path / "evals" / "step-0008" / "with_experience").is_dir()
    assert (tmp_path / "evals" / "step-0008" / "without_experience").is_dir()
    grpo = asyncio.run(tr.evaluate(dataclasses.replace(cfg, mode="grpo"), None, object(), 8))
    assert len(calls[-1]) == 4 and "with_experience" not in grpo and grpo["success"] == 0.0


def test_dynamic_sampling_seeds_stay_below_the_held_out_range_and_do_not_repeat_the_scheduled_ones():
    from crl_agent.train import group_seed

    cfg = TrainConfig(groups=2, dynamic_sampling=4, eval_seed=1000)
    for step in range(50):
        seeds = [group_seed(cfg, step, g) for g in range(2 + 4)]
        assert all(0 <= s < 1000 for s in seeds)
        assert len(set(seeds)) == 6
    assert [group_seed(cfg, 3, g) for g in range(2)] == [6, 7]  # the scheduled seeds are as before


def _sample(advantage=0.0, chosen=0):
    return TurnSample(prompt_ids=[5, 6, 7, 8], advantage=advantage, old_logprobs=[math.log(1 / 3)],
                      candidate_ids=[[9], [10], [11]], chosen=chosen, temperature=1.0, norm="sum")


def _learner(tiny, **kw):
    import transformers

    model = add_lora(transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32), r=4)
    return PolicyLearner(model, lr=5e-2, max_grad_norm=None, **kw)


def _move_away(learner, steps=5):
    """Push the policy away from the untrained one (and toward candidate 0)."""
    for _ in range(steps):
        s = _sample(advantage=1.0)
        s.old_logprobs = [_logprob(learner, s)]
        learner.update([s])


def _logprob(learner, s):
    from crl_agent.rl import action_logprob, batch_candidate_logprobs

    with torch.no_grad():
        sc = batch_candidate_logprobs(learner.model, [s.prompt_ids], [s.candidate_ids], s.norm)[0]
        return float(action_logprob(sc, s.chosen, s.temperature))


def test_divergence_is_zero_for_a_fresh_adapter_and_the_kl_term_pulls_the_policy_back(tiny):
    learner = _learner(tiny, kl_coef=1.0)
    fresh = learner.divergence([_sample()])
    assert fresh["kl_ref"] == pytest.approx(0.0, abs=1e-7) and fresh["tv_ref"] == pytest.approx(0.0, abs=1e-6)
    assert fresh["entropy_now"] == pytest.approx(fresh["entropy_ref"])
    plain = _learner(tiny)
    _move_away(plain)
    moved = plain.divergence([_sample()])["kl_ref"]
    assert moved > 1e-3
    # with the KL term, a turn whose advantage is 0 still gets a gradient: toward the reference
    learner.model.load_state_dict(plain.model.state_dict())
    before = learner.divergence([_sample()])["kl_ref"]
    assert before == pytest.approx(moved)
    for _ in range(5):
        metrics = learner.update([_sample(advantage=0.0)])
        assert metrics["updated"] == 1 and metrics["samples_used"] == 1
    assert learner.divergence([_sample()])["kl_ref"] < 0.5 * before
    # without it, such a turn is skipped
    assert plain.update([_sample(advantage=0.0)])["updated"] == 0


def test_the_entropy_bonus_raises_the_entropy_of_a_peaked_policy(tiny):
    learner = _learner(tiny, entropy_coef=1.0)
    _move_away(learner)
    before = learner.divergence([_sample()])["entropy_now"]
    for _ in range(5):
        learner.update([_sample(advantage=0.0)])
    assert learner.divergence([_sample()])["entropy_now"] > before


def test_kl_needs_a_lora_model_and_coefficients_are_checked(tiny):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    with pytest.raises(ValueError, match="LoRA"):
        PolicyLearner(model, lr=1e-3, kl_coef=0.1)
    with pytest.raises(ValueError, match=">= 0"):
        PolicyLearner(model, lr=1e-3, entropy_coef=-1)
    with pytest.raises(ValueError, match="--kl-coef"):
        TrainConfig(kl_coef=0.1, lora_rank=0).check()
    with pytest.raises(ValueError, match="--dynamic-sampling"):
        TrainConfig(dynamic_sampling=-1).check()


def test_explored_turns_are_corrected_by_policy_over_behaviour_and_the_first_ratio_is_one(tiny):
    from crl_agent.episode import Episode, ScoredTurn, Step
    from crl_agent.rl import turn_samples

    learner = _learner(tiny)
    s = _sample()
    policy_lp = _logprob(learner, s)
    behaviour_lp = math.log(0.5 * math.exp(policy_lp) + 0.5 / 3)  # 0.5 * policy + 0.5 * uniform over 3
    scored = ScoredTurn(candidates=["a", "b", "c"], logprobs=[0.0, 0.0, 0.0], probs=[1 / 3] * 3, chosen=0,
                        action_logprob=policy_lp, behaviour_logprob=behaviour_lp, temperature=1.0, score_norm="sum",
                        policy_version=0, prompt_token_ids=s.prompt_ids, candidate_token_ids=s.candidate_ids)
    ep = Episode("x", 0, steps=[Step(0, "obs", ["a", "b", "c"], "a", 0.0, True, False, False, False, 0.0,
                                     scored=scored)])
    [sample] = turn_samples([ep], [1.0]).samples
    assert sample.old_logprobs == [pytest.approx(policy_lp)]  # PPO's ratio starts from the policy's own
    assert sample.advantage == 1.0  # the importance weight is the sample's own, for its policy-gradient term
    assert sample.behaviour_weight == pytest.approx(math.exp(policy_lp - behaviour_lp))
    metrics = learner.update([sample])
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and metrics["clip_fraction"] == 0.0
    # a turn without exploration (behaviour = policy) keeps its advantage
    scored.behaviour_logprob = scored.action_logprob
    assert turn_samples([ep], [1.0]).samples[0].behaviour_weight == pytest.approx(1.0)


@pytest.mark.parametrize("stored", ["absent", 0])
def test_a_run_recorded_before_dynamic_sampling_was_the_default_resumes_only_as_it_was_trained(tmp_path, stored):
    import dataclasses

    from crl_agent.train import prepare_run_folder

    class OneRank:
        rank, world, main = 0, 1, True

        def barrier(self):
            pass

    old = dataclasses.asdict(TrainConfig(dynamic_sampling=0))
    del old["diagnose_every"]  # a field that did not exist then either
    if stored == "absent":  # a checkpoint written before the field existed ran with dynamic sampling off
        del old["dynamic_sampling"]
    torch.save({"config": old}, tmp_path / "checkpoint.pt")
    assert TrainConfig().dynamic_sampling == 4  # the default now
    with pytest.raises(SystemExit, match=r"dynamic_sampling\).*add --dynamic-sampling 0 to continue it as it was"):
        prepare_run_folder(TrainConfig(), tmp_path, OneRank(), resume=True)
    assert prepare_run_folder(TrainConfig(dynamic_sampling=0), tmp_path, OneRank(), resume=True) == tmp_path
    with pytest.raises(SystemExit, match="dynamic_sampling"):  # nor with another value
        prepare_run_folder(TrainConfig(dynamic_sampling=2), tmp_path, OneRank(), resume=True)


def test_a_run_from_before_truncated_importance_sampling_resumes_without_it(tmp_path):
    """A checkpoint whose config has no tis_cap ran with no correction: resuming it with the new default (2) is
    refused, naming --tis-cap 0; with it, the run goes on as it was."""
    import torch

    from crl_agent.train import prepare_run_folder

    class OneRank:
        rank, world, main = 0, 1, True

        def barrier(self):
            pass

    old = dataclasses.asdict(TrainConfig())
    del old["tis_cap"]
    torch.save({"config": old}, tmp_path / "checkpoint.pt")
    with pytest.raises(SystemExit, match=r"tis_cap\).*add --tis-cap 0.0 to continue it as it was"):
        prepare_run_folder(TrainConfig(), tmp_path, OneRank(), resume=True)
    assert prepare_run_folder(TrainConfig(tis_cap=0.0), tmp_path, OneRank(), resume=True) == tmp_path
