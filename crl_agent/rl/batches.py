"""From played episodes and extractor calls to learner batches, each weighted as the loss asks.

- :func:`turn_samples`: the actor's batch, one :class:`~crl_agent.rl.TurnSample` per scored turn
  carrying its episode's advantage and its loss coefficient (every episode the same, or every turn),
  computed here and nowhere else: the learner weighs every term of a sample by it, and ranks
  combine by their coefficients' sum;
- :func:`extractor_samples`: the extractor's CISPO batch of meta-rewarded calls, advantages from
  :func:`~crl_agent.rl.extractor_advantages`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, NamedTuple

from crl_agent.episode import Episode, ScoredTurn
from crl_agent.experience.calllog import training_buffer
from crl_agent.rl.advantages import extractor_advantages
from crl_agent.rl.samples import TurnSample

TURN_WEIGHTINGS = ("episode", "turn")


@dataclass
class ActorBatch:
    """The actor's samples, each carrying its loss coefficient.

    Attributes:
        samples: one per kept scored turn.
    """

    samples: list[TurnSample]

    @property
    def loss_weight(self) -> float:
        """The sum of the samples' coefficients: the episodes with a scored turn (``episode`` weighting)
        or the scored turns (``turn``). What the learner's loss is an average over, and so each rank's
        weight when a data-parallel run combines its ranks as one batch (a rank without samples: 0)."""
        return math.fsum(s.coef for s in self.samples)


def scored_turns(episode: Episode) -> list[ScoredTurn]:
    """The decisions of ``episode`` made by scoring the admissible actions (and tools: ``Step.decisions``)."""
    return [d for s in episode.steps for d in s.decisions]


def turn_samples(episodes: list[Episode], advantages: list[float], weighting: str = "episode",
                 per_episode: int = 0, rng: random.Random | None = None) -> ActorBatch:
    """One :class:`TurnSample` per scored turn, carrying its episode's advantage and its loss coefficient
    (``coef``), the one number the learner weighs its policy-gradient, KL and entropy terms by.

    ``weighting="episode"`` (default): every episode weighs the same and its turns share that weight
    (the coefficients of an episode's kept turns add up to 1), i.e. an episode is one sequence of its
    decisions under ``seq-mean-token-mean`` (as the official code, which trains on whole multi-turn
    trajectories). ``"turn"``: every turn weighs the same (an episode's coefficients add up to its
    number of scored turns), so long (typically failed) episodes dominate. ``per_episode > 0`` keeps a
    uniform random subset of that many turns of each episode, each carrying the episode's total over
    the turns kept, so the loss stays an unbiased estimate (a cheaper update, at more variance).

    A turn sampled from another behaviour than the policy (``--explore`` mixes in uniform) carries
    ``behaviour_weight = pi / mu``; PPO's old log-prob is the policy's own, so the ratio starts at 1.
    """
    if weighting not in TURN_WEIGHTINGS:
        raise ValueError(f"turn weighting must be one of {TURN_WEIGHTINGS}, got {weighting!r}")
    rng = rng or random.Random(0)
    samples = []
    for ep, adv in zip(episodes, advantages, strict=True):
        turns = scored_turns(ep)
        if not turns:
            continue
        kept = turns if not per_episode or len(turns) <= per_episode else \
            [turns[i] for i in sorted(rng.sample(range(len(turns)), per_episode))]
        # the episode's share of the loss (1, or its turns), split evenly over the turns kept
        coef = (1.0 if weighting == "episode" else float(len(turns))) / len(kept)
        for turn in kept:
            samples.append(TurnSample(
                prompt_ids=turn.prompt_token_ids, advantage=float(adv), old_logprobs=[turn.action_logprob],
                candidate_ids=turn.candidate_token_ids, chosen=turn.chosen, temperature=turn.temperature,
                norm=turn.score_norm, policy_version=int(turn.policy_version), coef=coef,
                behaviour_weight=math.exp(turn.action_logprob - turn.behaviour_logprob),
            ))
    return ActorBatch(samples)


class ExtractorBatch(NamedTuple):
    """The extractor's next CISPO batch: its samples, the calls they come from, and the calls dropped from
    the buffer to make room (their evidence is let go without an update). ``alike``: enough calls were
    ready but every one had earned the same reward, so none was taken (zero advantages teach nothing)."""

    samples: list[TurnSample]
    used: list[Any]
    dropped: list[Any]
    alike: bool = False


def extractor_samples(manager: Any, step: int, cooldown: int, batch: int, capacity: int = 0) -> ExtractorBatch:
    """The extractor's CISPO batch, popped from the training buffer
    (:func:`~crl_agent.experience.calllog.training_buffer`): the ``batch`` oldest calls with outcomes no
    update has trained on and a count-aware weight above 0 (a call trained within ``cooldown`` steps
    waits), each rewarded with the meta-reward of those new outcomes alone; advantage = (reward - mean) *
    weight (:func:`~crl_agent.rl.extractor_advantages`). ``capacity`` (0: none) bounds the buffer as the
    official ``MemoryTrainingBuffer`` does: of the calls ready to train, only the newest ``capacity`` are
    kept and the older ones are dropped (``dropped``; :meth:`ExperienceManager.drop_from_buffer` records
    it), so an update never trains on evidence that a buffer of that size would have let go.

    A batch needs two different rewards: against the batch mean, calls that all earned the same reward
    (every episode they guided failed, say) have zero advantages and an update on them changes no weight,
    yet would spend their evidence. So while the ``batch`` oldest are alike, the next calls in the buffer
    join them, oldest first, until one differs; if every kept call is alike, none is taken (``alike``) and
    they wait for evidence that tells them apart (the older ones beyond ``capacity`` are still dropped).
    With the official batch of 64 alike batches are rare; with 8 calls of a weak actor they are the rule.

    Each sample is stamped with the extractor version that sampled it and the temperature of its recorded
    log-probs (the distillations' 0.7), at which the learner recomputes them, and masks the tokens the model
    did not choose (``model_chosen``: a schema that allowed one token, a closer picked by rule). Nothing is
    taken or dropped while fewer than ``batch`` calls are ready."""
    ready = [s for s in training_buffer(manager.training_samples(step, cooldown)) if trainable_call(s)]
    if len(ready) < batch or batch < 1:
        return ExtractorBatch([], [], [])
    dropped = ready[:-capacity] if 0 < capacity < len(ready) else []
    kept = ready[len(dropped):]
    differs = next((i for i, s in enumerate(kept) if s.new_reward != kept[0].new_reward), None)
    if differs is None:
        return ExtractorBatch([], [], dropped, alike=True)
    chosen = kept[:max(batch, differs + 1)]
    advantages = extractor_advantages([s.new_reward for s in chosen], [s.weight for s in chosen]).tolist()
    samples = [TurnSample(prompt_ids=s.prompt_token_ids, response_ids=s.token_ids, old_logprobs=s.logprobs,
                          advantage=adv, policy_version=s.policy_version, temperature=s.temperature,
                          response_mask=s.model_chosen if len(s.model_chosen) == len(s.token_ids) else None)
               for s, adv in zip(chosen, advantages, strict=True)]
    return ExtractorBatch(samples, chosen, dropped)


def trainable_call(sample: Any) -> bool:
    """Whether a queued extractor call can be trained on now: a weight above 0, its prompt and reply ids,
    one log-prob per reply token, and at least one token the model chose."""
    return (sample.weight > 0 and bool(sample.prompt_token_ids) and bool(sample.token_ids)
            and len(sample.logprobs) == len(sample.token_ids)
            and (len(sample.model_chosen) != len(sample.token_ids) or any(sample.model_chosen)))
