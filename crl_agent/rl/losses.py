"""Policy-gradient losses as pure functions of per-token log-probs: PPO-clip and CISPO.

Shapes: ``logp``, ``old_logp`` and ``mask`` are ``[B, T]`` (one row per sample, padded), and
``advantages`` is ``[B]`` (one per sample, broadcast over its tokens). ``mask`` is 1 on the tokens
the policy produced (never on prompt or env tokens, never on padding). The importance ratio is
``rho = exp(logp - old_logp)``, where ``old_logp`` was recorded when the sample was generated.

- :func:`clipped_pg_loss` is PPO's clipped surrogate, per token ``-min(rho*A, clip(rho, 1-eps,
  1+eps)*A)``: the actor's loss (DESIGN section 7: eps = 0.2, one epoch, no KL term).
- :func:`cispo_loss` is CISPO (MiniMax-M1): per token ``-sg(clip(rho, 1-eps_low, 1+eps_high)) * A *
  logp``. The clipped ratio is a constant weight (stop-gradient), so every token keeps a gradient,
  even where PPO's clip would zero it. It is the extractor's loss (eps_low = eps_high = 0.1 in the
  official code's memory worker; TRL's ``cispo`` caps the ratio at an absolute ``epsilon_high``
  instead, a different convention).
- :func:`aggregate` reduces the per-token loss: ``"token-mean"`` weighs every token equally;
  ``"seq-mean-token-mean"`` (the official default) averages each sequence over its own tokens,
  then averages sequences that have any active token, so long and short samples weigh the same.
  A batch with no active token gives a zero loss that still belongs to the graph.
  :func:`coefficient_sum` is the learner's form: ``sum_b coef_b * (row b's token mean)``, one loss
  coefficient per sample (both aggregations are special cases of it).

Both losses take optional per-token ``is_weights`` (constants) that multiply the per-token loss:
the learner passes the truncated importance weights :func:`truncated_is_weights` against the
mismatch between the inference engine's log-probs and its own (TRL's ``vllm_importance_sampling_cap``,
verl's rollout importance sampling), times the exploration weight ``pi / mu`` of a turn sampled from
another behaviour.

:func:`ratio_stats` gives the diagnostics a learner logs (clip fraction, approximate KL);
:func:`mismatch_stats` those of the engine/learner mismatch.
"""

from __future__ import annotations

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean")


def _check(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
           is_weights: torch.Tensor | None = None, coef: torch.Tensor | None = None) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    if old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask {tuple(mask.shape)} must match"
        )
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must be [B] = [{logp.shape[0]}], got shape {tuple(advantages.shape)}")
    if is_weights is not None and is_weights.shape != logp.shape:
        raise ValueError(f"is_weights must be [B, T] = {tuple(logp.shape)}, got shape {tuple(is_weights.shape)}")
    if coef is not None and coef.shape != (logp.shape[0],):
        raise ValueError(f"coef must be [B] = [{logp.shape[0]}], got shape {tuple(coef.shape)}")


def _weigh(per_token: torch.Tensor, is_weights: torch.Tensor | None) -> torch.Tensor:
    if is_weights is None:
        return per_token
    # where(): padding may hold anything, and a weight there must not turn a 0 into nan
    return per_token * torch.nan_to_num(is_weights.detach().to(per_token.dtype), nan=0.0, posinf=0.0, neginf=0.0)


def _neutralise_padding(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero both log-probs off the mask: a padded ``inf`` would otherwise turn the gradient into nan."""
    off = mask == 0
    return logp.masked_fill(off, 0.0), old_logp.detach().to(logp.dtype).masked_fill(off, 0.0)


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str = "seq-mean-token-mean") -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar over the tokens where ``mask`` is set.

    Args:
        loss: ``[B, T]`` per-token loss.
        mask: ``[B, T]`` bool or 0/1 (fractional values act as token weights).
        mode: ``"token-mean"``: ``sum(loss*mask) / sum(mask)``; ``"seq-mean-token-mean"``: the mean,
            over sequences with any active token, of each sequence's masked token mean.

    Returns:
        A scalar; zero (connected to ``loss``'s graph) when no token is active.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregate must be one of {AGGREGATIONS}, got {mode!r}")
    if loss.shape != mask.shape or loss.dim() != 2:
        raise ValueError(f"loss {tuple(loss.shape)} and mask {tuple(mask.shape)} must both be [B, T]")
    m = mask.to(loss.dtype)
    # where() rather than loss*m: a padded position may hold inf/nan, and inf*0 is nan
    masked = torch.where(m != 0, loss * m, torch.zeros_like(loss))
    if mode == "token-mean":
        total = m.sum()
        return masked.sum() / total.clamp_min(1e-8) if total > 0 else masked.sum() * 0.0
    per_seq_tokens = m.sum(dim=-1)
    active = per_seq_tokens > 0
    if not active.any():
        return masked.sum() * 0.0
    seq_means = masked.sum(dim=-1)[active] / per_seq_tokens[active]
    return seq_means.mean()


def coefficient_sum(loss: torch.Tensor, mask: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """``sum_b coef[b] * (row b's mean over its active tokens)``: one loss coefficient per sample.

    ``"seq-mean-token-mean"`` is this with ``coef = 1 / (rows with an active token)``, ``"token-mean"``
    with ``coef[b] = (row b's active tokens) / (all active tokens)``. A row without an active token
    adds nothing; with none at all the result is a zero that still belongs to ``loss``'s graph.

    Args:
        loss: ``[B, T]`` per-token loss.
        mask: ``[B, T]`` bool or 0/1.
        coef: ``[B]`` the samples' coefficients (constants).
    """
    if loss.shape != mask.shape or loss.dim() != 2:
        raise ValueError(f"loss {tuple(loss.shape)} and mask {tuple(mask.shape)} must both be [B, T]")
    if coef.shape != (loss.shape[0],):
        raise ValueError(f"coef must be [B] = [{loss.shape[0]}], got shape {tuple(coef.shape)}")
    m = mask.to(loss.dtype)
    masked = torch.where(m != 0, loss * m, torch.zeros_like(loss))
    tokens = m.sum(dim=-1)
    row_means = masked.sum(dim=-1) / tokens.clamp_min(1.0)
    return (row_means * coef.detach().to(loss.dtype)).sum()


def clipped_pg_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    aggregate: str = "seq-mean-token-mean",
    is_weights: torch.Tensor | None = None,
    coef: torch.Tensor | None = None,
) -> torch.Tensor:
    """PPO's clipped surrogate: per token ``-w * min(rho*A, clip(rho, 1-eps, 1+eps)*A)``, then aggregated.

    Args:
        logp: ``[B, T]`` log-probs under the current policy (with gradient).
        old_logp: ``[B, T]`` the old policy's log-probs, the ratio's denominator (treated as constants).
        advantages: ``[B]`` one advantage per sample.
        mask: ``[B, T]`` tokens that count.
        clip_eps: ``eps``.
        aggregate: see :func:`aggregate`.
        is_weights: ``[B, T]`` importance weights ``w`` (constants; default 1), e.g.
            :func:`truncated_is_weights`.
        coef: ``[B]`` the samples' loss coefficients: given, the loss is :func:`coefficient_sum`
            instead of the ``aggregate`` reduction.
    """
    _check(logp, old_logp, advantages, mask, is_weights, coef)
    if clip_eps < 0:
        raise ValueError(f"clip_eps must be >= 0, got {clip_eps}")
    logp, old_logp = _neutralise_padding(logp, old_logp, mask)
    ratio = torch.exp(logp - old_logp)
    adv = advantages.detach().to(logp.dtype).unsqueeze(-1)
    per_token = _weigh(-torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv),
                       is_weights)
    return _aggregate(per_token, mask, aggregate) if coef is None else coefficient_sum(per_token, mask, coef)


def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.1,
    eps_high: float = 0.1,
    aggregate: str = "seq-mean-token-mean",
    is_weights: torch.Tensor | None = None,
    coef: torch.Tensor | None = None,
) -> torch.Tensor:
    """CISPO: per token ``-w * sg(clip(rho, 1-eps_low, 1+eps_high)) * A * logp``, then aggregated.

    Args:
        logp: ``[B, T]`` log-probs under the current policy (with gradient).
        old_logp: ``[B, T]`` the old policy's log-probs.
        advantages: ``[B]`` one advantage per sample.
        mask: ``[B, T]`` tokens that count.
        eps_low, eps_high: the ratio is clipped to ``[1 - eps_low, 1 + eps_high]``.
        aggregate: see :func:`aggregate`.
        is_weights: ``[B, T]`` importance weights ``w`` (constants; default 1).
        coef: ``[B]`` loss coefficients: given, the loss is :func:`coefficient_sum`.
    """
    _check(logp, old_logp, advantages, mask, is_weights, coef)
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"eps_low and eps_high must be >= 0, got {eps_low}, {eps_high}")
    logp, old_logp = _neutralise_padding(logp, old_logp, mask)
    ratio = torch.exp(logp.detach() - old_logp)
    weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    adv = advantages.detach().to(logp.dtype).unsqueeze(-1)
    per_token = _weigh(-(weight * adv * logp), is_weights)
    return _aggregate(per_token, mask, aggregate) if coef is None else coefficient_sum(per_token, mask, coef)


_aggregate = aggregate  # the loss functions' ``aggregate`` argument shadows the function's name


@torch.no_grad()
def truncated_is_weights(learner_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                         cap: float = 2.0) -> torch.Tensor:
    """Truncated importance weights ``min(pi_learner_old / pi_engine, cap)`` per token (1 off the mask).

    The inference engine that sampled a token (vLLM, a bf16 or batched forward) and the learner's own
    forward under the same weights give slightly different log-probs; the policy gradient is an
    expectation under the learner's policy, so each token's term is reweighted by their ratio,
    truncated at ``cap`` so that a token the engine found far less likely cannot dominate (TIS, as
    TRL's ``vllm_importance_sampling_cap`` and verl's rollout importance sampling).

    Args:
        learner_logp: ``[B, T]`` the learner's log-probs under the weights that sampled (constants).
        engine_logp: ``[B, T]`` the engine's log-probs recorded at sampling time.
        mask: ``[B, T]`` tokens that count.
        cap: the truncation ``C`` (> 0).
    """
    if not cap > 0:
        raise ValueError(f"the importance sampling cap must be > 0, got {cap}")
    if learner_logp.shape != engine_logp.shape or mask.shape != learner_logp.shape:
        raise ValueError(f"learner_logp {tuple(learner_logp.shape)}, engine_logp {tuple(engine_logp.shape)} "
                         f"and mask {tuple(mask.shape)} must match")
    on = mask.bool()
    log_ratio = torch.where(on, learner_logp.float() - engine_logp.float(), torch.zeros_like(learner_logp.float()))
    return torch.where(on, torch.exp(log_ratio).clamp(max=cap), torch.ones_like(log_ratio))


@torch.no_grad()
def mismatch_stats(learner_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                   cap: float | None = 2.0) -> dict[str, float]:
    """How far the engine's log-probs are from the learner's, over the active tokens (0s when none).

    Returns:
        ``is_logp_diff`` (mean ``|logp_engine - logp_learner|``), ``is_ratio_mean`` and ``is_ratio_max``
        (of ``pi_learner / pi_engine`` before truncation) and ``is_truncated`` (share of tokens whose
        ratio exceeds ``cap``; 0 without a cap).
    """
    m = mask.bool()
    if not m.any():
        return {"is_logp_diff": 0.0, "is_ratio_mean": 0.0, "is_ratio_max": 0.0, "is_truncated": 0.0}
    diff = (learner_logp.float() - engine_logp.float())[m]
    ratio = torch.exp(diff)
    return {
        "is_logp_diff": diff.abs().mean().item(),
        "is_ratio_mean": ratio.mean().item(),
        "is_ratio_max": ratio.max().item(),
        "is_truncated": (ratio > cap).float().mean().item() if cap is not None else 0.0,
    }


@torch.no_grad()
def ratio_stats(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, clip_low: float, clip_high: float
) -> dict[str, float]:
    """Diagnostics over the active tokens, all floats (0 when no token is active).

    Returns:
        ``clip_fraction`` (share of tokens whose ratio is outside ``[1-clip_low, 1+clip_high]``),
        ``approx_kl`` (the k3 estimator ``E[(rho - 1) - log rho]`` of KL(old || new)),
        ``ratio_mean`` and ``ratio_max``.
    """
    m = mask.bool()
    if not m.any():
        return {"clip_fraction": 0.0, "approx_kl": 0.0, "ratio_mean": 0.0, "ratio_max": 0.0}
    log_ratio = (logp.detach().float() - old_logp.detach().float())[m]
    ratio = torch.exp(log_ratio)
    clipped = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
    return {
        "clip_fraction": clipped.float().mean().item(),
        "approx_kl": ((ratio - 1.0) - log_ratio).mean().item(),
        "ratio_mean": ratio.mean().item(),
        "ratio_max": ratio.max().item(),
    }
