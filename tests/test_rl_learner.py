"""PolicyLearner: the loss of the whole batch, micro-batched; zero advantages skipped; OOM, NaN and staleness handled."""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.rl import (  # noqa: E402
    NonFiniteUpdate,
    OutOfMemory,
    PolicyLearner,
    TurnSample,
    action_logprob,
    add_lora,
    batch_sequence_logprobs,
    candidate_logprobs,
    clipped_pg_loss,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def ids(gen, n):
    return torch.randint(3, 259, (n,), generator=gen).tolist()


def make_samples(model, advantages=(1.0, -0.5, 0.0, 0.25, -1.0, 0.0), seed=0):
    """Mixed score-mode and generate-mode samples whose old log-probs are the model's own."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, adv in enumerate(advantages):
        prompt = ids(gen, 5 + 3 * i)
        if i % 2 == 0:
            cands = [ids(gen, n) for n in (2, 3, 1)]
            with torch.no_grad():
                old = action_logprob(candidate_logprobs(model, prompt, cands), i % 3)
            out.append(TurnSample(prompt, adv, [old.item()], candidate_ids=cands, chosen=i % 3))
        else:
            response = ids(gen, 2 + i)
            with torch.no_grad():
                old, _ = batch_sequence_logprobs(model, [prompt], [response])
            out.append(TurnSample(prompt, adv, old[0].tolist(), response_ids=response))
    return out


def grads_at_step(learner):
    """Record the (clipped) gradient the optimiser steps with."""
    seen = []
    step = learner.optimizer.step

    def recording(*args, **kwargs):
        seen.append([p.grad.clone() for p in learner.params])
        return step(*args, **kwargs)

    learner.optimizer.step = recording
    return seen


def full_batch_gradient(model, samples):
    """The gradient of clipped_pg_loss over every sample in one [B, T] batch (zero advantages included)."""
    rows = []
    for s in samples:
        if s.mode == "score":
            rows.append(action_logprob(candidate_logprobs(model, s.prompt_ids, s.candidate_ids), s.chosen).reshape(1))
        else:
            lp, _ = batch_sequence_logprobs(model, [s.prompt_ids], [s.response_ids])
            rows.append(lp[0])
    width = max(len(r) for r in rows)
    logp = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
    old = torch.zeros_like(logp)
    mask = torch.zeros_like(logp, dtype=torch.bool)
    for i, s in enumerate(samples):
        old[i, : len(s.old_logprobs)] = torch.tensor(s.old_logprobs)
        mask[i, : len(s.old_logprobs)] = True
    adv = torch.tensor([s.advantage for s in samples])
    model.zero_grad()
    clipped_pg_loss(logp, old, adv, mask).backward()
    return [p.grad.clone() for p in model.parameters()]


def assert_same_grads(a, b):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("budget", [100000, 40, 1])
def test_update_gradient_is_the_full_batch_gradient_whatever_the_micro_batches(model, budget):
    samples = make_samples(model)
    want = full_batch_gradient(copy.deepcopy(model), samples)
    learner = PolicyLearner(model, lr=1e-3, token_budget=budget, max_grad_norm=None)
    seen = grads_at_step(learner)
    metrics = learner.update(samples)
    assert_same_grads(seen[0], want)
    assert metrics["samples"] == 6 and metrics["samples_used"] == 4 and metrics["zero_advantage"] == 2
    assert metrics["updated"] == 1 and metrics["version"] == 1 and learner.version == 1
    assert metrics["micro_batches"] >= (4 if budget == 1 else 1)
    # nothing changed between sampling and the update: every ratio is 1
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and metrics["clip_fraction"] == 0.0


def test_zero_advantage_samples_get_no_step(model):
    before = [p.detach().clone() for p in model.parameters()]
    learner = PolicyLearner(model, lr=1e-2)
    metrics = learner.update(make_samples(model, advantages=(0.0, 0.0, 0.0)))
    assert metrics["updated"] == 0 and metrics["samples_used"] == 0 and metrics["tokens"] == 0
    assert learner.version == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_gradient_buffers_are_kept_and_zeroed_in_place(model):
    learner = PolicyLearner(model, lr=1e-3)
    samples = make_samples(model)
    learner.update(samples)
    buffers = [p.grad.data_ptr() for p in learner.params]
    assert all(p.grad is not None and not p.grad.any() for p in learner.params)
    learner.update(samples)
    assert [p.grad.data_ptr() for p in learner.params] == buffers


def test_out_of_memory_in_a_forward_splits_the_micro_batch(model, monkeypatch):
    samples = make_samples(model)
    want = full_batch_gradient(copy.deepcopy(model), samples)
    learner = PolicyLearner(model, lr=1e-3, max_grad_norm=None)
    forward = learner._forward

    def small_only(batch):
        if len(batch) > 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(batch)

    monkeypatch.setattr(learner, "_forward", small_only)
    seen = grads_at_step(learner)
    metrics = learner.update(samples)
    assert metrics["oom_splits"] >= 1 and metrics["micro_batches"] == 4 and metrics["updated"] == 1
    assert_same_grads(seen[0], want)


def test_out_of_memory_in_a_backward_redoes_the_update_with_half_the_budget(model, monkeypatch):
    samples = make_samples(model)
    want = full_batch_gradient(copy.deepcopy(model), samples)
    learner = PolicyLearner(model, lr=1e-3, max_grad_norm=None, token_budget=100000)
    backward = learner._backward
    calls = []

    def fails_once(loss):
        calls.append(1)
        backward(loss)  # the gradient is now (partly) accumulated: the learner must clear it
        if len(calls) == 1:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes")

    monkeypatch.setattr(learner, "_backward", fails_once)
    seen = grads_at_step(learner)
    learner.update(samples)
    assert learner.token_budget == 50000
    assert_same_grads(seen[0], want)


def test_a_sample_too_big_for_memory_alone_raises_a_clear_error(model, monkeypatch):
    learner = PolicyLearner(model, lr=1e-3)

    def never_fits(batch):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(learner, "_forward", never_fits)
    with pytest.raises(OutOfMemory, match="does not fit in memory even alone"):
        learner.update(make_samples(model))


def test_other_runtime_errors_are_not_taken_for_out_of_memory(model, monkeypatch):
    learner = PolicyLearner(model, lr=1e-3)
    monkeypatch.setattr(learner, "_forward", lambda batch: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        learner.update(make_samples(model))


def test_non_finite_updates_are_skipped_then_stop_the_run(model, monkeypatch):
    samples = make_samples(model)
    learner = PolicyLearner(model, lr=1e-3, max_nonfinite=2)
    before = [p.detach().clone() for p in model.parameters()]
    forward = learner._forward
    poisoned = {"on": True}

    def maybe_nan(batch):
        loss, stats, ent = forward(batch)
        return (loss * float("nan") if poisoned["on"] else loss), stats, ent

    monkeypatch.setattr(learner, "_forward", maybe_nan)
    metrics = learner.update(samples)
    assert metrics["updated"] == 0 and learner.version == 0 and learner.nonfinite_in_a_row == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(not p.grad.any() for p in learner.params if p.grad is not None)
    poisoned["on"] = False
    assert learner.update(samples)["updated"] == 1 and learner.nonfinite_in_a_row == 0
    poisoned["on"] = True
    samples = [TurnSample(**{**vars(s), "policy_version": 1}) for s in samples]
    learner.update(samples)
    with pytest.raises(NonFiniteUpdate, match="2 updates in a row"):
        learner.update(samples)


def test_a_non_finite_gradient_skips_the_update(model, monkeypatch):
    learner = PolicyLearner(model, lr=1e-3)
    backward = learner._backward

    def inf_grad(loss):
        backward(loss)
        learner.params[0].grad[0, 0] = float("inf")

    monkeypatch.setattr(learner, "_backward", inf_grad)
    metrics = learner.update(make_samples(model))
    assert metrics["updated"] == 0 and learner.nonfinite_in_a_row == 1


def test_stale_samples_are_counted_and_dropped_on_request(model):
    samples = make_samples(model)
    keep = PolicyLearner(model, lr=1e-3)
    keep.update(samples)  # version 1 now; the samples are from version 0
    metrics = keep.update(samples)
    assert metrics["stale"] == 6 and metrics["stale_dropped"] == 0 and metrics["samples_used"] == 4
    drop = PolicyLearner(copy.deepcopy(model), lr=1e-3, on_stale="drop")
    drop.version = 1
    metrics = drop.update(samples)
    assert metrics["stale"] == 6 and metrics["stale_dropped"] == 6 and metrics["updated"] == 0
    with pytest.raises(ValueError, match="claims policy version 5"):
        keep.update([TurnSample(**{**vars(samples[0]), "policy_version": 5})])


def test_cispo_loss_type_updates(model):
    learner = PolicyLearner(model, lr=1e-3, loss="cispo")
    metrics = learner.update(make_samples(model))
    assert metrics["updated"] == 1 and metrics["grad_norm"] > 0


def test_lora_learner_trains_only_the_adapter(model):
    pytest.importorskip("peft")
    model = add_lora(model, r=4)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    learner = PolicyLearner(model, lr=1e-2)
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    assert learner.update(make_samples(model))["updated"] == 1
    after = dict(model.named_parameters())
    assert all(torch.equal(base[n], after[n]) for n in base)
    assert any(not torch.equal(lora[n], after[n]) for n in lora)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"response_ids": None}, "exactly one"),
        ({"candidate_ids": [[1]], "chosen": 0}, "exactly one"),
        ({"old_logprobs": [0.0]}, "1 old_logprobs for 2"),
        ({"advantage": float("nan")}, "advantage must be finite"),
        ({"prompt_ids": []}, "non-empty prompt"),
        ({"coef": -1.0}, "coef must be"),
        ({"coef": float("inf")}, "coef must be"),
        ({"behaviour_weight": float("nan")}, "behaviour_weight must be"),
        ({"learner_logprobs": [0.0]}, "learner_logprobs must be 2"),
    ],
)
def test_turn_sample_refuses_inconsistent_fields(kwargs, message):
    args = {"prompt_ids": [1, 2], "advantage": 1.0, "old_logprobs": [-1.0, -2.0], "response_ids": [3, 4], **kwargs}
    with pytest.raises(ValueError, match=message):
        TurnSample(**args)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chosen": 2}, "chosen must index"),
        ({"chosen": None}, "chosen must index"),
        ({"candidate_ids": [[1], []]}, "each with at least one token"),
        ({"old_logprobs": [-1.0, -1.0]}, "single log-prob"),
        ({"temperature": 0.0}, "temperature"),
        ({"norm": "max"}, "norm"),
    ],
)
def test_score_mode_sample_refuses_inconsistent_fields(kwargs, message):
    args = {"prompt_ids": [1], "advantage": 1.0, "old_logprobs": [-0.7], "candidate_ids": [[2], [3, 4]], "chosen": 1}
    with pytest.raises(ValueError, match=message):
        TurnSample(**{**args, **kwargs})


# ------------------------------------------------------------- one loss coefficient per sample
def scored_turn(model, seed):
    """One score-mode decision of the model, as the policy records it (on-policy)."""
    from crl_agent.episode import ScoredTurn

    gen = torch.Generator().manual_seed(seed)
    prompt, cands = ids(gen, 6 + seed % 5), [ids(gen, n) for n in (1, 2, 3)]
    with torch.no_grad():
        lp = action_logprob(candidate_logprobs(model, prompt, cands), seed % 3).item()
    return ScoredTurn(candidates=["a", "b", "c"], logprobs=[0.0] * 3, probs=[1 / 3] * 3, chosen=seed % 3,
                      action_logprob=lp, behaviour_logprob=lp, temperature=1.0, score_norm="sum", policy_version=0,
                      prompt_token_ids=prompt, candidate_token_ids=cands)


def episode_of(turns):
    from crl_agent.episode import Episode, Step

    return Episode("test/Doors-v0", 0, steps=[Step(t, "obs", ["a", "b", "c"], "a", 0.0, True, False, False, False, 0.0,
                                                   scored=turn) for t, turn in enumerate(turns)])


def step_gradient(model, samples, **kwargs):
    learner = PolicyLearner(copy.deepcopy(model), lr=1e-3, max_grad_norm=None, **kwargs)
    seen = grads_at_step(learner)
    metrics = learner.update(samples)
    return seen[0], metrics


def norm(grads):
    return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))


@pytest.mark.parametrize(("per_episode", "same_turns"), [(0, False), (2, True), (5, True)])
def test_every_episode_weighs_the_same_whatever_its_length_and_the_turns_kept(model, per_episode, same_turns):
    """A won episode of 3 turns and a lost one of 12 (the same decisions, repeated): each weighs 1, so
    their gradients cancel; weighing turns instead, the long episode dominates."""
    import random

    from crl_agent.rl import turn_samples

    turns = [scored_turn(model, 0)] * 3 if same_turns else [scored_turn(model, i) for i in range(3)]
    episodes, advantages = [episode_of(turns), episode_of(turns * 4)], [1.0, -1.0]
    batch = turn_samples(episodes, advantages, "episode", per_episode, random.Random(1))
    kept = [len(turns) if not per_episode else min(per_episode, len(turns)), per_episode or 12]
    assert [len(batch.samples[: kept[0]]), len(batch.samples[kept[0]:])] == kept
    per_episode_coef = [sum(s.coef for s in batch.samples[: kept[0]]), sum(s.coef for s in batch.samples[kept[0]:])]
    assert per_episode_coef == pytest.approx([1.0, 1.0]) and batch.loss_weight == pytest.approx(2.0)
    cancelled, metrics = step_gradient(model, batch.samples)
    by_turn, _ = step_gradient(model, turn_samples(episodes, advantages, "turn", per_episode, random.Random(1)).samples)
    assert norm(by_turn) > 1e-3  # the control: 12 losing turns outweigh 3 winning ones
    assert norm(cancelled) < 1e-5 * norm(by_turn)
    assert metrics["samples"] == sum(kept) and metrics["updated"] == 1


def test_the_entropy_term_weighs_each_turn_by_its_coefficient_as_the_policy_gradient(model):
    """Entropy only (advantages 0): episodes of 3 copies of turn X and 12 of turn Y weigh the same,
    so the gradient is that of X and Y once each, not (3 X + 12 Y) / 15 as a per-turn weighting gives."""
    from crl_agent.rl import turn_samples

    x, y = scored_turn(model, 1), scored_turn(model, 2)
    batch = turn_samples([episode_of([x] * 3), episode_of([y] * 12)], [0.0, 0.0], "episode")
    got, metrics = step_gradient(model, batch.samples, entropy_coef=0.1)
    assert metrics["samples_used"] == 15
    once_each = turn_samples([episode_of([x]), episode_of([y])], [0.0, 0.0], "episode").samples
    want, _ = step_gradient(model, once_each, entropy_coef=0.1)
    assert_same_grads(got, want)
    per_turn, _ = step_gradient(model, turn_samples([episode_of([x] * 3), episode_of([y] * 12)], [0.0, 0.0],
                                                    "turn").samples, entropy_coef=0.1)
    assert norm([a - b for a, b in zip(per_turn, want, strict=True)]) > 1e-2 * norm(want)  # the weighting matters


def test_the_behaviour_weight_scales_only_its_samples_policy_gradient(model):
    [sample] = make_samples(model, advantages=(1.0,))
    plain, _ = step_gradient(model, [sample])
    weighted, _ = step_gradient(model, [TurnSample(**{**vars(sample), "behaviour_weight": 1.7, "learner_logprobs": None})])
    assert_same_grads(weighted, [1.7 * g for g in plain])


# ------------------------------------------------------- truncated importance sampling (engine vs learner)
def perturbed_samples(model):
    """make_samples, but the 'engine' recorded other log-probs than the learner computes: the score-mode
    choices 0.5 nat likelier (ratio e^-0.5), the generated tokens 1 nat less likely (ratio e, over the cap)."""
    out = []
    for s in make_samples(model):
        shift = 0.5 if s.mode == "score" else -1.0
        out.append(TurnSample(**{**vars(s), "old_logprobs": [x + shift for x in s.old_logprobs]}))
    return out


def expected_gradient(model, samples, cap):
    """One [B, T] batch: PPO against the learner's own log-probs, each token weighted by
    min(pi_learner / pi_engine, cap); cap None: against the engine's, unweighted (the old behaviour)."""
    own = make_samples(model)  # the same prompts and tokens, old log-probs the model's own
    if cap is None:
        return full_batch_gradient(copy.deepcopy(model), samples)
    model = copy.deepcopy(model)
    rows, learner, engine = [], [], []
    for s, o in zip(samples, own, strict=True):
        if s.mode == "score":
            rows.append(action_logprob(candidate_logprobs(model, s.prompt_ids, s.candidate_ids), s.chosen).reshape(1))
        else:
            lp, _ = batch_sequence_logprobs(model, [s.prompt_ids], [s.response_ids])
            rows.append(lp[0])
        learner.append(torch.tensor(o.old_logprobs))
        engine.append(torch.tensor(s.old_logprobs))
    width = max(len(r) for r in rows)

    def pad(xs):
        return torch.stack([torch.nn.functional.pad(x, (0, width - len(x))) for x in xs])

    logp, old, eng = pad(rows), pad(learner), pad(engine)
    mask = pad([torch.ones(len(r), dtype=torch.bool) for r in rows])
    weights = torch.where(mask, (old - eng).exp().clamp(max=cap), torch.ones_like(old))
    model.zero_grad()
    clipped_pg_loss(logp, old, torch.tensor([s.advantage for s in samples]), mask, is_weights=weights).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_truncated_importance_sampling_corrects_perturbed_engine_logprobs_and_logs_the_mismatch(model):
    samples = perturbed_samples(model)
    got, metrics = step_gradient(model, samples)  # tis_cap=2 by default
    assert_same_grads(got, expected_gradient(model, samples, cap=2.0))
    # PPO's ratio is against the learner's own log-probs: 1 on the first epoch whatever the engine said
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and metrics["clip_fraction"] == 0.0
    # the trained samples: scores 0 and 4 (1 token each, ratio e^-0.5), generations 1 and 3 (3 and 5 tokens, e)
    active = [s for s in samples if s.advantage != 0]
    tokens = sum(s.num_loss_tokens for s in active)
    generated = sum(s.num_loss_tokens for s in active if s.mode == "generate")
    assert metrics["is_logp_diff"] == pytest.approx((0.5 * (tokens - generated) + 1.0 * generated) / tokens, abs=1e-5)
    assert metrics["is_ratio_max"] == pytest.approx(math.e, rel=1e-4)
    assert metrics["is_ratio_mean"] == pytest.approx(
        (math.exp(-0.5) * (tokens - generated) + math.e * generated) / tokens, rel=1e-4)
    assert metrics["is_truncated"] == pytest.approx(generated / tokens)
    # the learner's log-probs were kept on the samples: a second epoch weighs them the same
    assert all(s.learner_logprobs is not None for s in active)


def test_without_a_cap_the_ratio_is_against_the_engines_logprobs(model):
    samples = perturbed_samples(model)
    got, metrics = step_gradient(model, samples, tis_cap=None)
    assert_same_grads(got, expected_gradient(model, samples, cap=None))
    assert metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-2) and metrics["clip_fraction"] > 0
    assert metrics["is_ratio_max"] == pytest.approx(math.e, rel=1e-4) and metrics["is_truncated"] == 0.0
    with pytest.raises(ValueError, match="tis_cap must be > 0"):
        PolicyLearner(model, tis_cap=0.0)


def test_later_epochs_keep_the_first_epochs_learner_logprobs_as_the_old_policy(model):
    samples = perturbed_samples(model)
    learner = PolicyLearner(model, lr=1e-2)
    first = learner.update(samples)
    second = learner.update(samples)  # the samples are one version old now
    assert second["stale"] == 6
    for k in ("is_logp_diff", "is_ratio_mean", "is_ratio_max", "is_truncated"):
        assert second[k] == pytest.approx(first[k], rel=1e-5), k
    assert second["ratio_mean"] != pytest.approx(1.0, abs=1e-4)  # the learner moved; the engine did not count


def saved_bytes(fn):
    """Bytes of the tensors autograd keeps for the backward pass while ``fn`` runs its forward."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total, out


@pytest.mark.parametrize("score_method", ["packed", "cache"])
@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_same_gradient(model, score_method, lora):
    if lora:
        pytest.importorskip("peft")
        model = add_lora(model, r=4)
    samples = make_samples(model)
    plain = PolicyLearner(copy.deepcopy(model), lr=1e-3, max_grad_norm=None, score_method=score_method)
    want = grads_at_step(plain)
    plain.update(copy.deepcopy(samples))
    learner = PolicyLearner(model, lr=1e-3, max_grad_norm=None, score_method=score_method, gradient_checkpointing=True)
    seen = grads_at_step(learner)
    metrics = learner.update(samples)
    assert metrics["updated"] == 1
    assert_same_grads(seen[0], want[0])
    # the layers are themselves again after the update
    from crl_agent.rl.recompute import decoder_layers

    assert all("forward" not in vars(layer) for layer in decoder_layers(model))


def test_gradient_checkpointing_keeps_a_fraction_of_the_activations(model):
    from crl_agent.rl import recomputed_layers

    prompt = torch.randint(3, 259, (4, 96), generator=torch.Generator().manual_seed(1))

    def forward():
        return batch_sequence_logprobs(model, prompt[:, :48].tolist(), prompt[:, 48:].tolist())[0]

    kept, lp = saved_bytes(forward)
    with recomputed_layers(model):
        kept_ckpt, lp_ckpt = saved_bytes(forward)
        grad_ckpt = torch.autograd.grad(lp_ckpt.sum(), [p for p in model.parameters() if p.requires_grad])
    grad = torch.autograd.grad(lp.sum(), [p for p in model.parameters() if p.requires_grad])
    assert kept_ckpt < 0.5 * kept, (kept_ckpt, kept)
    assert_same_grads(grad_ckpt, grad)
    # without gradient (scoring, generation) nothing is wrapped in a checkpoint: the same values
    with torch.no_grad(), recomputed_layers(model):
        torch.testing.assert_close(forward(), lp.detach())


def test_gradient_checkpointing_refuses_a_model_without_layers():
    class Flat(torch.nn.Module):
        def get_decoder(self):
            return torch.nn.Linear(2, 2)

    flat = Flat()
    flat.w = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(TypeError, match="no list of layers"):
        PolicyLearner(flat, gradient_checkpointing=True)
