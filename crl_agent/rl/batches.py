"""From played episodes and extractor calls to learner batches, each weighted as the loss asks.

- :func:`turn_samples`: the actor's batch, one :class:`~crl_agent.rl.TurnSample` per scored turn
  carrying its episode's advantage, with the loss weighting (every episode the same, or every turn)
  and the weight ranks combine by, both computed here from the same counts;
- :func:`extractor_samples`: the extractor's CISPO batch of meta-rewarded calls, advantages from
  :func:`~crl_agent.rl.extractor_advantages`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from crl_agent.episode import Episode, ScoredTurn
from crl_agent.rl.advantages import extractor_advantages
from crl_agent.rl.samples import TurnSample

TURN_WEIGHTINGS = ("episode", "turn")


@dataclass
class ActorBatch:
    """The actor's samples and what their loss is an average over.

    Attributes:
        samples: one per kept scored turn; advantages scaled so the learner's mean over rows is the
            asked weighting's loss.
        loss_weight: the episodes with a scored turn (``episode`` weighting) or the scored turns
            (``turn``): each rank's weight when a data-parallel run combines its ranks as one batch.
    """

    samples: list[TurnSample]
    loss_weight: float


def scored_turns(episode: Episode) -> list[ScoredTurn]:
    """The decisions of ``episode`` made by scoring the admissible actions (and tools: ``Step.decisions``)."""
    return [d for s in episode.steps for d in s.decisions]


def turn_samples(episodes: list[Episode], advantages: list[float], weighting: str = "episode",
                 per_episode: int = 0, rng: random.Random | None = None) -> ActorBatch:
    """One :class:`TurnSample` per scored turn, carrying its episode's advantage, scaled so that the
    learner's mean over rows is the loss ``weighting`` asks for.

    ``weighting="episode"`` (default): every episode weighs the same and its turns share that weight,
    i.e. an episode is one sequence of its decisions under ``seq-mean-token-mean`` (as the official
    code, which trains on whole multi-turn trajectories). ``"turn"``: every turn weighs the same, so
    long (typically failed) episodes dominate. ``per_episode > 0`` keeps a uniform random subset of
    that many turns of each episode, reweighted so the loss stays an unbiased estimate (a cheaper
    update, at more variance).
    """
    if weighting not in TURN_WEIGHTINGS:
        raise ValueError(f"turn weighting must be one of {TURN_WEIGHTINGS}, got {weighting!r}")
    rng = rng or random.Random(0)
    chosen: list[tuple[list[ScoredTurn], float, int]] = []  # (kept turns, advantage, the episode's scored turns)
    for ep, adv in zip(episodes, advantages, strict=True):
        turns = scored_turns(ep)
        if not turns:
            continue
        kept = turns if not per_episode or len(turns) <= per_episode else \
            [turns[i] for i in sorted(rng.sample(range(len(turns)), per_episode))]
        chosen.append((kept, float(adv), len(turns)))
    rows = sum(len(k) for k, _, _ in chosen)
    total_turns = sum(n for _, _, n in chosen)
    samples = []
    for kept, adv, n in chosen:
        # the learner averages over `rows`; this factor turns that average into the asked weighting
        share = 1 / (len(chosen) * len(kept)) if weighting == "episode" else n / (len(kept) * total_turns)
        for turn in kept:
            # PPO's old log-prob is the policy's own (so the ratio starts at 1); a turn sampled from another
            # behaviour (--explore mixes in uniform) is corrected by the importance weight policy / behaviour
            weight = math.exp(turn.action_logprob - turn.behaviour_logprob)
            samples.append(TurnSample(
                prompt_ids=turn.prompt_token_ids, advantage=adv * share * rows * weight,
                old_logprobs=[turn.action_logprob],
                candidate_ids=turn.candidate_token_ids, chosen=turn.chosen, temperature=turn.temperature,
                norm=turn.score_norm, policy_version=int(turn.policy_version),
            ))
    # what that loss averages over: every episode given (a rank without scored turns weighs 0)
    counts = [len(scored_turns(ep)) for ep in episodes]
    loss_weight = float(sum(1 for n in counts if n) if weighting == "episode" else sum(counts))
    return ActorBatch(samples, loss_weight)


def extractor_samples(manager: Any, step: int, cooldown: int, batch: int) -> tuple[list[TurnSample], list[Any]]:
    """The extractor's CISPO batch: the latest ``batch`` calls with a meta-reward and a count-aware weight
    above 0 (a call trained within ``cooldown`` steps is left out: see :mod:`crl_agent.experience.calllog`),
    advantage = (reward - mean) * weight (:func:`~crl_agent.rl.extractor_advantages`), each stamped with
    the extractor version that sampled it and the temperature of its recorded log-probs (the
    distillations' 0.7), at which the learner recomputes them. Returns the samples and the calls they
    come from (``([], [])`` while fewer than ``batch`` are ready)."""
    ready = [s for s in manager.training_samples(step, cooldown) if s.reward is not None and s.weight > 0
             and s.prompt_token_ids and s.token_ids and len(s.logprobs) == len(s.token_ids)]
    if not ready or len(ready) < batch:
        return [], []
    ready = ready[-batch:]
    advantages = extractor_advantages([s.reward for s in ready], [s.weight for s in ready]).tolist()
    samples = [TurnSample(prompt_ids=s.prompt_token_ids, response_ids=s.token_ids, old_logprobs=s.logprobs,
                          advantage=adv, policy_version=s.policy_version, temperature=s.temperature)
               for s, adv in zip(ready, advantages, strict=True)]
    return samples, ready
