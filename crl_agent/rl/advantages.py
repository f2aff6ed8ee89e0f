"""Advantages: the actor's split-group baseline and the extractor's weighted meta-reward.

Actor (DESIGN section 7, "Actor"). Each group holds K rollouts of one task seed; the first half run
without experience, the second half with retrieved experience in context. Rewards are normalised
within each (group, with-experience) subgroup, so a rollout is compared only with rollouts that
saw the same conditions: the official config's ``reward_normalization: {grouping:
traj_group_id_w_or_wo_memory, method: mean}`` subtracts the subgroup mean (``scale="mean"``, the
default); the paper's text also divides by the subgroup's standard deviation (``scale="mean_std"``,
population std, plus 1e-6). A subgroup of a single rollout has no baseline and gets advantage 0.

Extractor (DESIGN section 7, "Extractor"; issue 15). Each extractor generation's reward is the mean
outcome of the episodes its entries guided, an outcome of 0 counting as -1
(:func:`crl_agent.rl.credit.meta_reward`); its advantage is that reward minus the batch mean, times
the count-aware weight (:func:`count_aware_weights`), as the official pipeline multiplies its
advantages by ``sample_weight``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from crl_agent.rl.credit import count_aware_weight, meta_reward

SCALES = ("mean", "mean_std")


def _as_1d_float(x, name: str) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.float64) if not isinstance(x, torch.Tensor) else x
    if t.dim() != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {tuple(t.shape)}")
    return t


def _keys(x, n: int, name: str) -> list[Hashable]:
    if isinstance(x, torch.Tensor):
        if x.dim() != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {tuple(x.shape)}")
        x = x.tolist()
    x = list(x)
    if len(x) != n:
        raise ValueError(f"{name} has {len(x)} items but rewards has {n}")
    return x


def split_group_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: torch.Tensor | Sequence[Hashable],
    with_experience: torch.Tensor | Sequence[bool],
    scale: str = "mean",
) -> torch.Tensor:
    """One advantage per rollout, normalised within its (group id, with_experience) subgroup.

    Args:
        rewards: ``[N]`` episode rewards (finite).
        group_ids: ``[N]`` group of each rollout (ints, strings, anything hashable).
        with_experience: ``[N]`` whether the rollout had experience in context.
        scale: ``"mean"``: ``A = r - mean``; ``"mean_std"``: ``A = (r - mean) / (std + 1e-6)``,
            population std. A subgroup of one rollout gets 0.

    Returns:
        ``[N]`` advantages, float32 (or the dtype of a floating ``rewards`` tensor).

    Raises:
        ValueError: unknown ``scale``, mismatched lengths or non-finite rewards.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    r = _as_1d_float(rewards, "rewards")
    out_dtype = r.dtype if r.is_floating_point() and isinstance(rewards, torch.Tensor) else torch.float32
    r = r.detach().to(torch.float64)
    if not torch.isfinite(r).all():
        raise ValueError("rewards must be finite")
    n = r.shape[0]
    groups = _keys(group_ids, n, "group_ids")
    flags = [bool(f) for f in _keys(with_experience, n, "with_experience")]
    members: dict[tuple[Hashable, bool], list[int]] = {}
    for i, key in enumerate(zip(groups, flags, strict=True)):
        members.setdefault(key, []).append(i)
    adv = torch.zeros(n, dtype=torch.float64)
    for idx in members.values():
        if len(idx) < 2:
            continue
        sub = r[idx]
        centred = sub - sub.mean()
        if scale == "mean_std":
            centred = centred / (sub.std(unbiased=False) + 1e-6)
        adv[idx] = centred
    return adv.to(out_dtype)


def count_aware_weights(
    train_counts: torch.Tensor | Sequence[int],
    last_trained_steps: torch.Tensor | Sequence[int | None],
    step: int,
    cooldown: int = 1,
    power: float = 0.5,
) -> torch.Tensor:
    """Count-aware weight per sample: ``0`` if trained within ``cooldown`` steps, else ``(1 + n) ** -power``.

    Args:
        train_counts: ``[N]`` how often each sample's entry has been trained on (>= 0).
        last_trained_steps: ``[N]`` the step it was last trained at; ``None`` or any negative value
            (e.g. the official code's ``-1``) means never, and such a sample is never cooling down.
        step: the current training step.
        cooldown: an entry last trained at ``s`` gets 0 while ``step - s <= cooldown``.
        power: the exponent of the decay.

    Returns:
        ``[N]`` float32 weights.
    """
    counts = train_counts.tolist() if isinstance(train_counts, torch.Tensor) else list(train_counts)
    lasts = _keys(last_trained_steps, len(counts), "last_trained_steps")
    return torch.tensor(
        [
            count_aware_weight(int(c), None if s is None else int(s), int(step), cooldown, power)
            for c, s in zip(counts, lasts, strict=True)
        ],
        dtype=torch.float32,
    )


def extractor_rewards(guided_outcomes: Sequence[Sequence[float]]) -> torch.Tensor:
    """Meta-reward per extractor generation: mean outcome of the episodes it guided, 0 counting as -1.

    Args:
        guided_outcomes: for each generation, the outcomes (success 0/1 or ±1) of the episodes its
            entries guided.

    Returns:
        ``[N]`` float32 rewards.

    Raises:
        ValueError: a generation guided no episode yet (it has no reward: leave it out of the batch
            until it has; :func:`crl_agent.experience.calllog.fold_samples` marks it ``reward=None``).
    """
    rewards = []
    for i, outcomes in enumerate(guided_outcomes):
        r = meta_reward(outcomes)
        if r is None:
            raise ValueError(f"generation {i} guided no episode yet: it has no reward; leave it out of the batch")
        rewards.append(r)
    return torch.tensor(rewards, dtype=torch.float32)


def extractor_advantages(
    rewards: torch.Tensor | Sequence[float], weights: torch.Tensor | Sequence[float]
) -> torch.Tensor:
    """``(R - mean(R)) * w``: the extractor's advantage per generation (the batch mean is over all of ``R``).

    Raises:
        ValueError: mismatched lengths, an empty batch or non-finite values.
    """
    r = _as_1d_float(rewards, "rewards").detach().to(torch.float32)
    w = _as_1d_float(weights, "weights").detach().to(torch.float32)
    if r.shape != w.shape:
        raise ValueError(f"rewards has {r.shape[0]} items but weights has {w.shape[0]}")
    if r.numel() == 0:
        raise ValueError("an empty batch has no advantages")
    if not (torch.isfinite(r).all() and torch.isfinite(w).all()):
        raise ValueError("rewards and weights must be finite")
    return (r - r.mean()) * w
