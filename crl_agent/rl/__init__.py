"""Complementary RL's algorithm core: advantages, losses, log-probs, the learner and checkpoints.

The pieces a trainer (``python -m crl_agent.train``) imports, each a small module with its own tests:

- :mod:`~crl_agent.rl.advantages`: ``split_group_advantages`` (the actor's split-group baseline),
  ``count_aware_weights``, ``extractor_rewards`` and ``extractor_advantages`` (the extractor's
  meta-reward); :mod:`~crl_agent.rl.credit` holds their scalar, torch-free rules.
- :mod:`~crl_agent.rl.losses`: ``clipped_pg_loss`` (PPO-clip), ``cispo_loss`` (CISPO), ``aggregate``,
  ``coefficient_sum`` (one loss coefficient per sample), ``truncated_is_weights`` and ``mismatch_stats``
  (the inference engine against the learner).
- :mod:`~crl_agent.rl.logprobs`: ``sequence_logprobs``, ``candidate_logprobs``, ``action_logprob``
  (differentiable, chunked so no full-vocabulary logits are ever kept).
- :mod:`~crl_agent.rl.samples`: ``TurnSample`` (one actor turn as sampled, score or generate mode);
  :mod:`~crl_agent.rl.batches`: ``turn_samples`` (the actor's batch from episodes, with the loss
  weighting) and ``extractor_samples`` (the extractor's CISPO batch from meta-rewarded calls);
  :mod:`~crl_agent.rl.learner`: ``PolicyLearner`` (one AdamW update per call);
  :mod:`~crl_agent.rl.recompute`: ``recomputed_layers`` (its gradient checkpointing).
- :mod:`~crl_agent.rl.weight_sync`: ``SharedWeights`` and ``ExportedAdapter``, how new weights reach
  the backend that samples the next rollouts.
- :mod:`~crl_agent.rl.lora`: ``add_lora``; :mod:`~crl_agent.rl.checkpoint`: atomic checkpoints and
  ``config_diff``; :mod:`~crl_agent.rl.distributed`: ``Distributed`` (``torchrun`` data parallelism).

Names are imported lazily, so ``crl_agent.rl.credit`` (used by the experience call log) does not
pull in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "meta_reward": "credit",
    "count_aware_weight": "credit",
    "split_group_advantages": "advantages",
    "count_aware_weights": "advantages",
    "extractor_rewards": "advantages",
    "extractor_advantages": "advantages",
    "aggregate": "losses",
    "clipped_pg_loss": "losses",
    "cispo_loss": "losses",
    "ratio_stats": "losses",
    "coefficient_sum": "losses",
    "truncated_is_weights": "losses",
    "mismatch_stats": "losses",
    "sequence_logprobs": "logprobs",
    "batch_sequence_logprobs": "logprobs",
    "candidate_logprobs": "logprobs",
    "batch_candidate_logprobs": "logprobs",
    "action_logprob": "logprobs",
    "token_logprobs": "logprobs",
    "TurnSample": "samples",
    "ActorBatch": "batches",
    "turn_samples": "batches",
    "extractor_samples": "batches",
    "SharedWeights": "weight_sync",
    "ExportedAdapter": "weight_sync",
    "PolicyLearner": "learner",
    "NonFiniteUpdate": "learner",
    "OutOfMemory": "learner",
    "add_lora": "lora",
    "is_lora": "lora",
    "export_weights": "lora",
    "trainable_state_dict": "lora",
    "load_trainable_state_dict": "lora",
    "save_checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    "Checkpoint": "checkpoint",
    "config_diff": "checkpoint",
    "Distributed": "distributed",
    "recomputed_layers": "recompute",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'crl_agent.rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"crl_agent.rl.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
