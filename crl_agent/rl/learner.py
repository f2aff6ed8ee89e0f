"""The policy learner: one optimiser update of a causal LM from a list of turn samples.

Each sample is a :class:`crl_agent.rl.samples.TurnSample`: one actor turn as it was sampled.

:meth:`PolicyLearner.update` recomputes the log-probs with gradient (:mod:`crl_agent.rl.logprobs`),
applies ``clipped_pg_loss`` (``loss="ppo"``, the actor's) or ``cispo_loss`` (``loss="cispo"``, the
extractor's) and takes one AdamW step at a constant learning rate after clipping the gradient norm.

The loss is ``sum_i c_i * term_i / sum_i c_i`` over the samples given, where ``c_i`` is the sample's
loss coefficient (``TurnSample.coef``, times its loss tokens under ``aggregate="token-mean"``) and
``term_i`` its policy-gradient term (its per-token loss averaged over its tokens) plus, in score mode,
its KL and entropy terms. The denominator counts every sample given, and ``sum_i c_i`` is also the
weight data-parallel ranks combine by. The policy-gradient term is importance-weighted:

- by ``min(pi_learner_old / pi_engine, tis_cap)`` per token (truncated importance sampling): the
  inference engine that sampled (vLLM, a bf16 or batched forward) and the learner's own forward
  disagree slightly even under the same weights. ``pi_learner_old`` is the learner's log-prob under
  the weights that sampled (computed, without gradient, in the first update at the sample's
  ``policy_version`` and kept on the sample for later epochs), and it is PPO's (or CISPO's) old
  policy, so the clipped ratio measures only the learner's own change. A stale sample whose learner
  log-probs were never computed falls back to the engine's as the old policy, unweighted.
  ``tis_cap=None`` turns the correction off (the ratio is then against the engine's log-probs);
- by the sample's ``behaviour_weight`` (``pi / mu`` of an explored turn).

The update is the one the whole list would give in a single batch, but:

- samples whose advantage is exactly 0 get no forward or backward pass: they add nothing to the
  gradient (a group whose rewards are all equal is skipped whole);
- the rest run in micro-batches of at most ``token_budget`` padded tokens with gradient
  accumulation. An out-of-memory error in a forward pass splits that micro-batch in two and retries;
  one in a backward pass (the gradient may be half-accumulated) clears the gradient and redoes the
  update with half the budget, which is kept for later updates. A single sample that does not fit
  raises :class:`OutOfMemory`;
- a non-finite loss or gradient norm skips the update (logged); after ``max_nonfinite`` in a row,
  :class:`NonFiniteUpdate` is raised;
- the gradient buffers are zeroed in place, never freed (``zero_grad(set_to_none=True)`` re-allocated
  about 1 GB a step on this kind of machine and made step times swing from 3.5 to 20 s: DESIGN 9);
- stale samples (``policy_version`` below :attr:`PolicyLearner.version`, the number of updates
  applied) are counted, and either kept, their recorded log-probs acting as the importance
  correction (``on_stale="correct"``), or dropped (``on_stale="drop"``).

The model runs in eval mode during the update (no dropout), so recomputed log-probs of an
unchanged policy equal the sampler's. ``gradient_checkpointing=True`` recomputes each decoder layer's
activations in the backward pass instead of keeping them (:mod:`crl_agent.rl.recompute`): about a
quarter of the activation memory, for one more forward pass.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from crl_agent.rl.logprobs import NORMS, action_logprob, batch_candidate_logprobs, batch_sequence_logprobs
from crl_agent.rl.lora import is_lora
from crl_agent.rl.losses import (
    AGGREGATIONS,
    cispo_loss,
    clipped_pg_loss,
    mismatch_stats,
    ratio_stats,
    truncated_is_weights,
)
from crl_agent.rl.recompute import decoder_layers, recomputed_layers
from crl_agent.rl.samples import TurnSample

log = logging.getLogger(__name__)

LOSSES = ("ppo", "cispo")
STALE_POLICIES = ("correct", "drop")


class NonFiniteUpdate(RuntimeError):
    """Too many updates in a row had a non-finite loss or gradient."""


class OutOfMemory(RuntimeError):
    """A single sample does not fit in memory, even alone."""


def _is_oom(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text


@dataclass
class _Pass:
    """Sums over one update's micro-batches."""

    loss: float = 0.0
    stats: list[tuple[dict[str, float], int]] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    tokens: int = 0
    micro_batches: int = 0
    splits: int = 0
    nonfinite_loss: bool = False


class PolicyLearner:
    """AdamW over a causal LM's trainable parameters, one update per :meth:`update` call.

    Args:
        model: a Hugging Face causal LM, plain or ``peft``-wrapped (see :func:`crl_agent.rl.add_lora`).
        lr: the constant learning rate.
        loss: ``"ppo"`` (:func:`clipped_pg_loss`) or ``"cispo"`` (:func:`cispo_loss`).
        clip_eps: PPO's ``eps``.
        eps_low, eps_high: CISPO's clip range.
        aggregate: ``"seq-mean-token-mean"`` or ``"token-mean"``.
        max_grad_norm: gradient-norm clip (``None``: no clipping).
        token_budget: most padded tokens per micro-batch.
        weight_decay, betas: AdamW's.
        max_nonfinite: non-finite updates in a row before :class:`NonFiniteUpdate`.
        on_stale: ``"correct"`` keeps samples from older policy versions (their recorded log-probs are
            the importance correction); ``"drop"`` leaves them out.
        score_method: how candidates are scored (see :func:`crl_agent.rl.batch_candidate_logprobs`).
        params: the parameters to train (default: every parameter with ``requires_grad``).
        reduce_gradients: data-parallel training (see :class:`crl_agent.rl.distributed.Distributed`):
            called as ``reduce_gradients(params, weight, (active, nonfinite))`` after each update's
            backward passes, on every rank, even one without samples; it must replace the gradients by
            the weighted mean over ranks and return the flags summed over ranks, so that every rank
            clips, steps or skips alike.
        kl_coef: score mode: adds ``kl_coef * KL(pi || pi_ref)`` per turn, the exact KL between the
            softmaxes over the turn's candidates, ``pi_ref`` being the model with its LoRA adapter
            disabled (the untrained policy). 0 (default, as the official code): no KL term.
        entropy_coef: score mode: subtracts ``entropy_coef * H(pi)`` per turn (an entropy bonus). With
            either term on, every turn gets a backward pass, even one whose advantage is 0. Both terms
            are weighted by the turn's coefficient, as its policy-gradient term.
        tis_cap: the truncation ``C`` of the importance weight ``pi_learner_old / pi_engine`` (2, as
            TRL's ``vllm_importance_sampling_cap``); ``None``: no correction.
        gradient_checkpointing: recompute the decoder layers' activations in the backward pass (less
            memory, ~+20% update time); the gradients are the same.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float = 1e-6,
        loss: str = "ppo",
        clip_eps: float = 0.2,
        eps_low: float = 0.1,
        eps_high: float = 0.1,
        aggregate: str = "seq-mean-token-mean",
        max_grad_norm: float | None = 1.0,
        token_budget: int = 8192,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        max_nonfinite: int = 3,
        on_stale: str = "correct",
        score_method: str = "packed",
        params: Iterable[torch.nn.Parameter] | None = None,
        reduce_gradients: Callable[[Sequence[torch.Tensor], float, Sequence[float]], list[float]] | None = None,
        kl_coef: float = 0.0,
        entropy_coef: float = 0.0,
        tis_cap: float | None = 2.0,
        gradient_checkpointing: bool = False,
    ):
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        if aggregate not in AGGREGATIONS:
            raise ValueError(f"aggregate must be one of {AGGREGATIONS}, got {aggregate!r}")
        if on_stale not in STALE_POLICIES:
            raise ValueError(f"on_stale must be one of {STALE_POLICIES}, got {on_stale!r}")
        if token_budget < 1 or max_nonfinite < 1 or not lr > 0:
            raise ValueError("token_budget and max_nonfinite must be >= 1 and lr > 0")
        if not (kl_coef >= 0 and entropy_coef >= 0):
            raise ValueError(f"kl_coef and entropy_coef must be >= 0, got {kl_coef}, {entropy_coef}")
        if tis_cap is not None and not tis_cap > 0:
            raise ValueError(f"tis_cap must be > 0 (or None: no correction), got {tis_cap}")
        if kl_coef > 0 and not is_lora(model):
            raise ValueError("kl_coef needs a LoRA model: the reference policy is the model with its adapter disabled")
        if gradient_checkpointing:
            decoder_layers(model)  # refuse a model without a layer stack now, not at the first update
        self.model = model
        self.gradient_checkpointing = bool(gradient_checkpointing)
        self.params = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters (requires_grad is False everywhere)")
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, betas=betas, weight_decay=weight_decay)
        self.loss, self.clip_eps, self.eps_low, self.eps_high = loss, clip_eps, eps_low, eps_high
        self.aggregate, self.max_grad_norm, self.token_budget = aggregate, max_grad_norm, token_budget
        self.max_nonfinite, self.on_stale, self.score_method = max_nonfinite, on_stale, score_method
        self.reduce_gradients = reduce_gradients
        self.kl_coef, self.entropy_coef = float(kl_coef), float(entropy_coef)
        self.tis_cap = None if tis_cap is None else float(tis_cap)
        self.version = 0
        self.nonfinite_in_a_row = 0

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Optimiser state, version and counters (the weights are saved by :mod:`crl_agent.rl.checkpoint`)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "nonfinite_in_a_row": self.nonfinite_in_a_row,
            "token_budget": self.token_budget,
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.nonfinite_in_a_row = int(state.get("nonfinite_in_a_row", 0))
        self.token_budget = int(state.get("token_budget", self.token_budget))

    # ------------------------------------------------------------- the update
    def update(self, samples: Sequence[TurnSample], weight: float | None = None) -> dict[str, float]:
        """One optimiser step from ``samples``; returns metrics (all floats).

        ``weight`` matters only in data-parallel training: what this rank's loss is an average over, so
        ranks combine as one batch (default: the sum of its samples' coefficients, as the loss divides by).

        Metrics: ``loss``, ``clip_fraction``, ``approx_kl``, ``ratio_mean``, ``ratio_max`` (of PPO's
        ratio against the old policy), ``is_logp_diff``, ``is_ratio_mean``, ``is_ratio_max`` and
        ``is_truncated`` (the engine/learner mismatch over the tokens trained on whose learner
        log-probs are known: see :func:`crl_agent.rl.losses.mismatch_stats`),
        ``entropy`` (mean entropy of score-mode action distributions; 0 without any), ``grad_norm``
        (before clipping), ``samples`` (given), ``samples_used`` (with a backward pass),
        ``zero_advantage`` (skipped), ``stale`` and ``stale_dropped``, ``tokens`` (processed by
        forward passes), ``micro_batches``, ``oom_splits``, ``updated`` (1 if the step was taken),
        ``version`` (after the update), ``time_s``.

        Raises:
            NonFiniteUpdate: the ``max_nonfinite``-th non-finite update in a row.
            OutOfMemory: a single sample does not fit.
            ValueError: a sample claims a policy version newer than the learner's.
        """
        start = time.perf_counter()
        future = [s for s in samples if s.policy_version > self.version]
        if future:
            raise ValueError(
                f"a sample claims policy version {future[0].policy_version} but the learner is at {self.version} "
                "(samples from another run, or a learner restored from an older checkpoint?)"
            )
        stale = [s for s in samples if s.policy_version < self.version]
        kept = [s for s in samples if not (self.on_stale == "drop" and s.policy_version < self.version)]
        # the loss's denominator: every kept sample's coefficient, including those skipped for a zero advantage
        total = sum(self._coef(s) for s in kept)
        regularised = self.kl_coef > 0 or self.entropy_coef > 0  # a term that every scored turn carries
        active = [s for s in kept if self._coef(s) > 0
                  and (s.advantage != 0.0 or (regularised and s.mode == "score"))]
        metrics = {
            "samples": float(len(samples)),
            "samples_used": float(len(active)),
            "zero_advantage": float(sum(1 for s in kept if s.advantage == 0.0)),
            "stale": float(len(stale)),
            "stale_dropped": float(len(samples) - len(kept)),
        }
        was_training = self.model.training
        self.model.eval()
        try:
            self.optimizer.zero_grad(set_to_none=False)
            with recomputed_layers(self.model, self.gradient_checkpointing):
                run = self._accumulate(active, total) if active else _Pass()
            any_active = bool(active)
            if self.reduce_gradients is not None:  # every rank, with or without samples (a collective)
                if weight is None:
                    weight = total
                n_active, n_nonfinite = self.reduce_gradients(self.params, weight, (len(active), run.nonfinite_loss))
                any_active, run.nonfinite_loss = n_active > 0, n_nonfinite > 0
            grad_norm = self._grad_norm() if any_active else 0.0
        finally:
            self.model.train(was_training)
        nonfinite = run.nonfinite_loss or not math.isfinite(grad_norm)
        if nonfinite:
            self.optimizer.zero_grad(set_to_none=False)
            self.nonfinite_in_a_row += 1
            log.warning(
                "skipped an update with a non-finite %s (%d in a row)",
                "loss" if run.nonfinite_loss else "gradient",
                self.nonfinite_in_a_row,
            )
            if self.nonfinite_in_a_row >= self.max_nonfinite:
                raise NonFiniteUpdate(
                    f"{self.nonfinite_in_a_row} updates in a row had a non-finite loss or gradient; "
                    "lower the learning rate, check the advantages and old log-probs, or train in float32"
                )
        elif any_active:
            self.nonfinite_in_a_row = 0
            if self.max_grad_norm is not None:
                torch.nn.utils.clip_grads_with_norm_(self.params, self.max_grad_norm, torch.tensor(grad_norm))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=False)
            self.version += 1
        metrics.update(_mean_stats(run.stats))
        metrics.update(
            loss=run.loss,
            entropy=sum(run.entropies) / len(run.entropies) if run.entropies else 0.0,
            grad_norm=grad_norm,
            tokens=float(run.tokens),
            micro_batches=float(run.micro_batches),
            oom_splits=float(run.splits),
            updated=float(any_active and not nonfinite),
            version=float(self.version),
            time_s=time.perf_counter() - start,
        )
        return metrics

    def _coef(self, s: TurnSample) -> float:
        """The sample's loss coefficient: its own, times its loss tokens under ``token-mean``."""
        return s.coef * (s.num_loss_tokens if self.aggregate == "token-mean" else (s.num_loss_tokens > 0))

    def _grad_norm(self) -> float:
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.nn.utils.get_total_norm(grads, 2.0))

    def _micro_batches(self, samples: list[TurnSample], budget: int) -> list[list[TurnSample]]:
        # longest first so padding stays small; each batch's cost is rows * its longest sample
        ordered = sorted(samples, key=lambda s: -s.num_tokens)
        batches: list[list[TurnSample]] = []
        for s in ordered:
            if batches and batches[-1][0].num_tokens * (len(batches[-1]) + 1) <= budget:
                batches[-1].append(s)
            else:
                batches.append([s])
        return batches

    def _accumulate(self, samples: list[TurnSample], total: float) -> _Pass:
        while True:
            run = _Pass()
            queue = self._micro_batches(samples, self.token_budget)
            try:
                while queue:
                    batch = queue.pop(0)
                    try:
                        loss, stats, entropies = self._forward(batch)
                    except RuntimeError as e:
                        if not _is_oom(e):
                            raise
                        if len(batch) == 1:
                            raise OutOfMemory(
                                f"one sample of {batch[0].num_tokens} tokens does not fit in memory even alone; "
                                "shorten the episodes' context or use a smaller model"
                            ) from e
                        log.warning("out of memory on a micro-batch of %d samples: splitting it", len(batch))
                        run.splits += 1
                        half = len(batch) // 2
                        queue[:0] = [batch[:half], batch[half:]]
                        continue
                    scaled = loss / total
                    if not torch.isfinite(scaled):
                        run.nonfinite_loss = True
                        return run
                    self._backward(scaled)
                    run.loss += scaled.item()
                    run.stats.append((stats, sum(s.num_loss_tokens for s in batch)))  # token-weighted means
                    run.entropies.extend(entropies)
                    run.tokens += sum(s.num_tokens for s in batch)
                    run.micro_batches += 1
                return run
            except RuntimeError as e:
                if not _is_oom(e) or isinstance(e, OutOfMemory):
                    raise
                # a backward pass ran out of memory: the gradient may be half-accumulated
                self.optimizer.zero_grad(set_to_none=False)
                if self.token_budget <= 1:
                    raise OutOfMemory("out of memory in a backward pass even at a 1-token budget") from e
                self.token_budget = max(1, self.token_budget // 2)
                log.warning("out of memory in a backward pass: redoing the update with token_budget=%d", self.token_budget)

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _forward(self, batch: list[TurnSample]) -> tuple[torch.Tensor, dict[str, float], list[float]]:
        """The micro-batch's ``sum_i c_i * term_i`` (not yet divided by the update's total coefficient),
        its ratio and mismatch stats and its action entropies."""
        entropies: list[float] = []
        scored = [s for s in batch if s.mode == "score"]
        generated = [s for s in batch if s.mode == "generate"]
        by_id: dict[int, torch.Tensor] = {}
        extra: dict[int, torch.Tensor] = {}  # score mode: each turn's KL / entropy term (kl_coef, entropy_coef)
        for norm in NORMS:
            group = [s for s in scored if s.norm == norm]
            if not group:
                continue
            scores = batch_candidate_logprobs(
                self.model, [s.prompt_ids for s in group], [s.candidate_ids for s in group], norm, self.score_method
            )
            refs = self._reference_scores(group, norm) if self.kl_coef > 0 else [None] * len(group)
            for s, sc, ref in zip(group, scores, refs, strict=True):
                by_id[id(s)] = action_logprob(sc, s.chosen, s.temperature).reshape(1)
                logp_all = torch.log_softmax(sc.float() / s.temperature, -1)
                entropy = -(logp_all.exp() * logp_all).sum()
                entropies.append(float(entropy.detach()))
                if ref is not None or self.entropy_coef > 0:
                    term = -self.entropy_coef * entropy
                    if ref is not None:
                        term = term + self.kl_coef * _kl(logp_all, torch.log_softmax(ref.float() / s.temperature, -1))
                    extra[id(s)] = term
        if generated:
            # at the temperature each response was sampled with, so the first epoch's ratio is 1
            lp, _ = batch_sequence_logprobs(self.model, [s.prompt_ids for s in generated],
                                            [s.response_ids for s in generated], [s.temperature for s in generated])
            for i, s in enumerate(generated):
                by_id[id(s)] = lp[i, : len(s.response_ids)]
        logps = [by_id[id(s)] for s in batch]
        width = max(len(x) for x in logps)
        device = logps[0].device
        engine = torch.zeros(len(batch), width, device=device)  # the log-probs recorded at sampling time
        learner = torch.zeros(len(batch), width, device=device)  # the learner's own under the same weights
        known = torch.zeros(len(batch), 1, dtype=torch.bool, device=device)
        mask = torch.zeros(len(batch), width, dtype=torch.bool, device=device)
        rows = []
        for i, (s, x) in enumerate(zip(batch, logps, strict=True)):
            rows.append(torch.nn.functional.pad(x, (0, width - len(x))))
            engine[i, : len(x)] = torch.tensor(s.old_logprobs, device=device)
            # a generated token the model did not choose (forced by a schema) carries no gradient signal
            mask[i, : len(x)] = True if s.response_mask is None else torch.tensor(s.response_mask, device=device)
            if s.learner_logprobs is None and s.policy_version == self.version:
                # these weights sampled it: kept for the epochs after this one, when they will have moved
                s.learner_logprobs = x.detach().float().tolist()
            if s.learner_logprobs is not None:
                learner[i, : len(x)] = torch.tensor(s.learner_logprobs, device=device)
                known[i] = True
        logp = torch.stack(rows)
        if self.tis_cap is None:
            old, weights = engine, torch.ones_like(engine)
        else:
            old = torch.where(known, learner, engine)
            weights = torch.where(known, truncated_is_weights(learner, engine, mask, self.tis_cap), 1.0)
        weights = weights * torch.tensor([s.behaviour_weight for s in batch], device=device).unsqueeze(-1)
        adv = torch.tensor([float(s.advantage) for s in batch], device=device)
        coef = torch.tensor([self._coef(s) for s in batch], device=device)
        if self.loss == "ppo":
            loss = clipped_pg_loss(logp, old, adv, mask, clip_eps=self.clip_eps, is_weights=weights, coef=coef)
            low = high = self.clip_eps
        else:
            loss = cispo_loss(logp, old, adv, mask, eps_low=self.eps_low, eps_high=self.eps_high, is_weights=weights,
                              coef=coef)
            low, high = self.eps_low, self.eps_high
        if extra:  # the KL and entropy terms weigh by the same coefficient as the policy gradient
            loss = loss + sum(coef[i] * extra[id(s)] for i, s in enumerate(batch) if id(s) in extra)
        stats = ratio_stats(logp, old, mask, low, high)
        stats.update(mismatch_stats(learner, engine, mask & known, self.tis_cap))
        stats["is_tokens"] = float((mask & known).sum())
        return loss, stats, entropies

    @torch.no_grad()
    def _reference_scores(self, samples: list[TurnSample], norm: str) -> list[torch.Tensor]:
        """The candidates' scores under the reference policy: the model with its LoRA adapter disabled."""
        with self.model.disable_adapter():
            return [x.detach() for x in batch_candidate_logprobs(
                self.model, [s.prompt_ids for s in samples], [s.candidate_ids for s in samples], norm, self.score_method)]

    @torch.no_grad()
    def divergence(self, samples: Sequence[TurnSample]) -> dict[str, float]:
        """How far the policy has moved from the reference (the model with its LoRA adapter disabled),
        over these score-mode turns: mean exact ``kl_ref`` = KL(pi || pi_ref) and ``tv_ref`` (total
        variation) between the softmaxes over each turn's candidates, and the mean entropies
        ``entropy_now`` and ``entropy_ref`` (not ``entropy``: :meth:`update` reports that one, over the
        turns it trains on). Empty for a model without LoRA or without score-mode turns.

        A diagnostic (no gradient, no optimiser step); it reads the weights as they are now."""
        scored = [s for s in samples if s.mode == "score"]
        if not scored or not is_lora(self.model):
            return {}
        was_training = self.model.training
        self.model.eval()
        sums = {"kl_ref": 0.0, "tv_ref": 0.0, "entropy_now": 0.0, "entropy_ref": 0.0}
        try:
            for batch in self._micro_batches(scored, self.token_budget):
                for norm in NORMS:
                    group = [s for s in batch if s.norm == norm]
                    if not group:
                        continue
                    cur = batch_candidate_logprobs(self.model, [s.prompt_ids for s in group],
                                                   [s.candidate_ids for s in group], norm, self.score_method)
                    ref = self._reference_scores(group, norm)
                    for s, a, b in zip(group, cur, ref, strict=True):
                        lp, lq = torch.log_softmax(a.float() / s.temperature, -1), torch.log_softmax(b.float() / s.temperature, -1)
                        sums["kl_ref"] += float(_kl(lp, lq))
                        sums["tv_ref"] += float(0.5 * (lp.exp() - lq.exp()).abs().sum())
                        sums["entropy_now"] += float(-(lp.exp() * lp).sum())
                        sums["entropy_ref"] += float(-(lq.exp() * lq).sum())
        finally:
            self.model.train(was_training)
        return {k: v / len(scored) for k, v in sums.items()}


def _kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) of two distributions given as log-probs over the same support."""
    return (logp.exp() * (logp - logq)).sum()


def _mean_stats(parts: list[tuple[dict[str, float], int]]) -> dict[str, float]:
    names = ("clip_fraction", "approx_kl", "ratio_mean")
    total = sum(n for _, n in parts)
    out = {k: (sum(st[k] * n for st, n in parts) / total if total else 0.0) for k in names}
    out["ratio_max"] = max((st["ratio_max"] for st, _ in parts), default=0.0)
    # the mismatch stats cover the tokens whose learner log-probs are known
    known = sum(st.get("is_tokens", 0.0) for st, _ in parts)
    for k in ("is_logp_diff", "is_ratio_mean", "is_truncated"):
        out[k] = sum(st.get(k, 0.0) * st.get("is_tokens", 0.0) for st, _ in parts) / known if known else 0.0
    out["is_ratio_max"] = max((st.get("is_ratio_max", 0.0) for st, _ in parts), default=0.0)
    return out
