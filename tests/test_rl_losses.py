"""The pure functions of crl_agent.rl against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from crl_agent.rl import (  # noqa: E402
    action_logprob,
    aggregate,
    cispo_loss,
    clipped_pg_loss,
    coefficient_sum,
    count_aware_weights,
    extractor_advantages,
    extractor_rewards,
    mismatch_stats,
    ratio_stats,
    split_group_advantages,
    truncated_is_weights,
)
from crl_agent.rl.credit import count_aware_weight, meta_reward  # noqa: E402


def close(actual, expected, tol=1e-5):
    actual = torch.as_tensor(actual, dtype=torch.float64)
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float64), atol=tol, rtol=0)


# ------------------------------------------------------------------ advantages
REWARDS = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5, 2.0, 2.0]
GROUPS = ["a", "a", "a", "a", "a", "a", "b", "c", "c"]
WITH_EXP = [False, False, False, True, True, True, False, False, False]


def test_split_group_advantages_subtract_each_halfs_own_mean():
    # (a, without): mean 2/3; (a, with): mean 2/3; (b): one rollout -> 0; (c): equal rewards -> 0
    adv = split_group_advantages(REWARDS, GROUPS, WITH_EXP)
    close(adv, [1 / 3, -2 / 3, 1 / 3, 1 / 3, 1 / 3, -2 / 3, 0.0, 0.0, 0.0])


def test_split_group_advantages_never_mix_the_halves():
    # the same group: 4 wins without experience, 4 losses with it. Pooled, both halves would get +-0.5.
    adv = split_group_advantages([1, 1, 1, 1, 0, 0, 0, 0], [7] * 8, [0, 0, 0, 0, 1, 1, 1, 1])
    close(adv, [0.0] * 8)


def test_split_group_advantages_mean_std_divides_by_the_population_std():
    adv = split_group_advantages(REWARDS, GROUPS, WITH_EXP, scale="mean_std")
    # population std of (1, 0, 1) is sqrt(2)/3; (1/3) / (sqrt(2)/3) = 1/sqrt(2)
    s = 1 / math.sqrt(2)
    close(adv, [s, -2 * s, s, s, s, -2 * s, 0.0, 0.0, 0.0], tol=1e-4)


def test_split_group_advantages_group_by_key_not_by_position():
    adv = split_group_advantages(torch.tensor([3.0, 10.0, 1.0, 20.0]), torch.tensor([1, 2, 1, 2]), [True] * 4)
    close(adv, [1.0, -5.0, -1.0, 5.0])
    assert adv.dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale": "std"}, "scale"),
        ({"group_ids": [0, 0]}, "group_ids has 2 items"),
        ({"rewards": [1.0, float("nan"), 0.0]}, "finite"),
    ],
)
def test_split_group_advantages_reject_bad_input(kwargs, message):
    args = {"rewards": [1.0, 0.0, 0.0], "group_ids": [0, 0, 0], "with_experience": [False] * 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        split_group_advantages(**args)


def test_count_aware_weights_cool_down_then_decay():
    # step 6, cooldown 1: never trained -> (1+n)^-0.5; trained at 5 (6-5=1 <= 1) -> 0;
    # at 4 -> 2^-0.5; the -1 sentinel means never; trained at this very step -> 0
    w = count_aware_weights([0, 3, 1, 2, 0], [None, 5, 4, -1, 6], step=6)
    close(w, [1.0, 0.0, 2**-0.5, 3**-0.5, 0.0])
    close(count_aware_weights(torch.tensor([3, 1]), torch.tensor([5, -1]), step=6, cooldown=0, power=1.0), [0.25, 0.5])


def test_count_aware_weight_rejects_negative_counts():
    with pytest.raises(ValueError, match="train_count"):
        count_aware_weight(-1, None, 0)


def test_extractor_rewards_count_a_zero_outcome_as_minus_one():
    close(extractor_rewards([[1, 0, 1], [0], [1, 1], [-1, 1]]), [1 / 3, -1.0, 1.0, 0.0])
    assert meta_reward([]) is None
    with pytest.raises(ValueError, match="guided no episode"):
        extractor_rewards([[1], []])


def test_extractor_advantages_centre_on_the_batch_then_weight():
    # mean of (1/3, -1, 1, 0) is 1/12
    adv = extractor_advantages(torch.tensor([1 / 3, -1.0, 1.0, 0.0]), [1.0, 0.5, 0.0, 1.0])
    close(adv, [0.25, -13 / 24, 0.0, -1 / 12])
    with pytest.raises(ValueError, match="weights has 1"):
        extractor_advantages([1.0, 2.0], [1.0])


# ---------------------------------------------------------------------- losses
def test_aggregate_token_mean_and_seq_mean_token_mean():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    close(aggregate(loss, mask, "token-mean"), (1 + 2 + 4) / 3)
    # rows 1.5 and 4; the row with no active token is not averaged in
    close(aggregate(loss, mask, "seq-mean-token-mean"), 2.75)


def test_aggregate_with_no_active_token_is_a_zero_in_the_graph():
    loss = torch.ones(2, 3, requires_grad=True)
    for mode in ("token-mean", "seq-mean-token-mean"):
        out = aggregate(loss, torch.zeros(2, 3), mode)
        assert out.item() == 0.0 and out.requires_grad


def test_aggregate_ignores_garbage_on_padding():
    loss = torch.tensor([[1.0, float("nan")], [2.0, float("inf")]])
    close(aggregate(loss, torch.tensor([[1, 0], [1, 0]]), "seq-mean-token-mean"), 1.5)


# ratios 1.5, 0.5, 1.0 | 1.1, 0.7, (padding); advantages +1 and -2; old log-probs 0
RATIOS = [[1.5, 0.5, 1.0], [1.1, 0.7, 1.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([1.0, -2.0])


def _logp():
    logp = torch.log(torch.tensor(RATIOS))
    logp[1, 2] = 1000.0  # garbage on padding (exp overflows): must not leak into loss or gradient
    return logp.requires_grad_(True)


def test_clipped_pg_loss_hand_computed():
    # row 0 (A=+1): -min(1.5, 1.2)=-1.2, -min(0.5, 0.8)=-0.5, -1.0 -> mean -0.9
    # row 1 (A=-2): -min(-2.2, -2.2)=2.2, -min(-1.4, -1.6)=1.6 -> mean 1.9
    logp = _logp()
    loss = clipped_pg_loss(logp, torch.zeros(2, 3), ADV, MASK)
    close(loss, (-0.9 + 1.9) / 2)
    loss.backward()
    # clipped tokens (1.5 with A>0, 0.7 with A<0) get no gradient; others -rho*A * 1/len(row) * 1/B
    close(logp.grad, [[0.0, -0.5 / 6, -1.0 / 6], [2.2 / 4, 0.0, 0.0]])
    token_mean = clipped_pg_loss(_logp(), torch.zeros(2, 3), ADV, MASK, aggregate="token-mean")
    close(token_mean, (-1.2 - 0.5 - 1.0 + 2.2 + 1.6) / 5)


def test_clipped_pg_loss_clip_eps_is_honoured():
    # eps 0.6: 1.5 is inside [0.4, 1.6], so row 0 is -(1.5 + 0.5 + 1.0) / 3
    loss = clipped_pg_loss(_logp()[:1], torch.zeros(1, 3), ADV[:1], MASK[:1], clip_eps=0.6)
    close(loss, -1.0)


def test_cispo_loss_hand_computed():
    # weights clip(rho, 0.9, 1.1): 1.1, 0.9, 1.0 | 1.1, 0.9
    logp = _logp()
    loss = cispo_loss(logp, torch.zeros(2, 3), ADV, MASK)
    row0 = (-1.1 * math.log(1.5) - 0.9 * math.log(0.5) - 1.0 * 0.0) / 3
    row1 = (2 * 1.1 * math.log(1.1) + 2 * 0.9 * math.log(0.7)) / 2
    close(loss, (row0 + row1) / 2)
    loss.backward()
    # every token keeps a gradient -w*A, even where PPO's clip would cut it
    close(logp.grad, [[-1.1 / 6, -0.9 / 6, -1.0 / 6], [2.2 / 4, 1.8 / 4, 0.0]])


def test_cispo_loss_eps_low_and_high_are_separate():
    logp = torch.log(torch.tensor([[0.5, 2.0]])).requires_grad_(True)
    cispo_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), eps_low=0.2, eps_high=0.5).backward()
    close(logp.grad, [[-0.8 / 2, -1.5 / 2]])


def test_losses_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="advantages must be"):
        clipped_pg_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="must match"):
        cispo_loss(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="aggregate must be"):
        clipped_pg_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), aggregate="sum")


def test_ratio_stats_count_clipped_tokens_and_the_k3_kl():
    stats = ratio_stats(torch.log(torch.tensor(RATIOS)), torch.zeros(2, 3), MASK, 0.2, 0.2)
    assert stats["clip_fraction"] == pytest.approx(3 / 5)  # 1.5, 0.5 and 0.7 lie outside [0.8, 1.2]
    kl = sum((r - 1) - math.log(r) for r in (1.5, 0.5, 1.0, 1.1, 0.7)) / 5
    assert stats["approx_kl"] == pytest.approx(kl, abs=1e-6)
    assert stats["ratio_max"] == pytest.approx(1.5)


def test_coefficient_sum_weighs_each_rows_token_mean_by_its_coefficient():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, float("nan")], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    # row means 1.5 and 4; the row without an active token adds nothing whatever its coefficient
    close(coefficient_sum(loss, mask, torch.tensor([2.0, 0.5, 10.0])), 2 * 1.5 + 0.5 * 4)
    # both aggregations are special cases: 1 / (active rows), and (row tokens) / (all tokens)
    close(coefficient_sum(loss, mask, torch.tensor([0.5, 0.5, 0.0])), aggregate(loss, mask, "seq-mean-token-mean").item())
    close(coefficient_sum(loss, mask, torch.tensor([2 / 3, 1 / 3, 0.0])), aggregate(loss, mask, "token-mean").item())
    with pytest.raises(ValueError, match="coef must be"):
        coefficient_sum(loss, mask, torch.ones(2))


def test_losses_with_coefficients_and_importance_weights_hand_computed():
    # the RATIOS rows with is_weights 2 on token (0, 1) and 0.5 on (1, 0); coefficients 3 and 1
    w = torch.tensor([[1.0, 2.0, 1.0], [0.5, 1.0, 7.0]])  # 7 on padding: ignored
    logp = _logp()
    loss = clipped_pg_loss(logp, torch.zeros(2, 3), ADV, MASK, is_weights=w, coef=torch.tensor([3.0, 1.0]))
    # row 0: (-1.2 - 2 * 0.5 - 1.0) / 3 = -3.2 / 3; row 1: (0.5 * 2.2 + 1.6) / 2 = 1.35
    close(loss, 3 * (-3.2 / 3) + 1.35)
    loss.backward()
    # the weights scale each token's gradient; the clipped tokens still get none
    close(logp.grad, [[0.0, -2 * 0.5 * 3 / 3, -1.0 * 3 / 3], [0.5 * 2.2 / 2, 0.0, 0.0]])
    logp = _logp()
    cispo_loss(logp, torch.zeros(2, 3), ADV, MASK, is_weights=w, coef=torch.tensor([3.0, 1.0])).backward()
    close(logp.grad, [[-1.1, -2 * 0.9, -1.0], [0.5 * 2.2 / 2, 1.8 / 2, 0.0]])
    with pytest.raises(ValueError, match="is_weights must be"):
        clipped_pg_loss(logp, torch.zeros(2, 3), ADV, MASK, is_weights=torch.ones(2, 2))


def test_truncated_is_weights_are_the_learner_over_engine_ratio_capped():
    learner = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, 0.0, 0.0]])
    engine = torch.tensor([[-1.5, -1.0, -0.5], [-4.0, 0.0, 50.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # ratios e^0.5 = 1.649, e^-1 = 0.368, 1 | e^1 = 2.718 (capped), 1 | padding: 1
    close(truncated_is_weights(learner, engine, mask, cap=2.0), [[math.exp(0.5), math.exp(-1), 1.0], [2.0, 1.0, 1.0]])
    close(truncated_is_weights(learner, engine, mask, cap=1.5), [[1.5, math.exp(-1), 1.0], [1.5, 1.0, 1.0]])
    stats = mismatch_stats(learner, engine, mask, cap=2.0)
    assert stats["is_logp_diff"] == pytest.approx((0.5 + 1.0 + 0 + 1.0 + 0) / 5)
    assert stats["is_ratio_mean"] == pytest.approx((math.exp(0.5) + math.exp(-1) + 1 + math.e + 1) / 5)
    assert stats["is_ratio_max"] == pytest.approx(math.e) and stats["is_truncated"] == pytest.approx(1 / 5)
    assert mismatch_stats(learner, engine, torch.zeros(2, 3))["is_ratio_mean"] == 0.0
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(learner, engine, mask, cap=0.0)


def test_action_logprob_is_a_tempered_log_softmax():
    scores = torch.tensor([-1.0, -2.0, -3.0])
    close(action_logprob(scores, 0), -math.log(1 + math.exp(-1) + math.exp(-2)))
    # temperature 2: scores/2 = (-0.5, -1, -1.5); chosen 2
    close(action_logprob(scores, 2, temperature=2.0), -1.0 - math.log(1 + math.exp(-0.5) + math.exp(-1)))
    with pytest.raises(ValueError, match="chosen"):
        action_logprob(scores, 3)
    with pytest.raises(ValueError, match="temperature"):
        action_logprob(scores, 0, temperature=0.0)


def test_the_call_log_folds_rewards_and_weights_with_the_same_rules():
    from crl_agent.experience.calllog import fold_samples

    records = [
        {"type": "call", "call_id": "c1", "kind": "distil", "messages": [], "entries": []},
        {"type": "call", "call_id": "c2", "kind": "distil", "messages": [], "entries": []},
        {"type": "outcome", "episode": "e1", "outcome": 1, "call_ids": ["c1"]},
        {"type": "outcome", "episode": "e2", "outcome": 0, "call_ids": ["c1"]},
        {"type": "outcome", "episode": "e3", "outcome": 0, "call_ids": ["c1"]},
    ]
    got = {s.call_id: s.reward for s in fold_samples(records)}
    assert got == {"c1": pytest.approx(extractor_rewards([[1, 0, 0]]).item()), "c2": None}
