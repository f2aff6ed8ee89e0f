"""One training sample: an actor turn as it was sampled, in score mode or generate mode.

A :class:`TurnSample` keeps the turn's exact prompt token ids (never re-tokenised: DESIGN sections 7
and 9, after the re-tokenisation bugs peers hit) and either a *score-mode* decision (the candidate
actions' token ids, the index chosen and the temperature of ``softmax(scores / temperature)``) or a
*generate-mode* response (its token ids, sampled from ``softmax(logits / temperature)``), with the
log-probs recorded at sampling time (of that same tempered distribution, so the importance ratio
starts at 1), the advantage of its episode and the version of the policy that sampled it. The loss covers only what
the policy produced: the response tokens, or the one choice among the candidates.

A sample's weight in the loss is one number, its ``coef``: the learner's loss is
``sum_i coef_i * term_i / sum_i coef_i``, where ``term_i`` is the sample's policy-gradient term (its
per-token loss averaged over its tokens) plus its KL and entropy terms. :func:`crl_agent.rl.turn_samples`
sets it so that every episode weighs the same (or every turn); the data-parallel ranks combine by
``sum_i coef_i``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from crl_agent.rl.logprobs import NORMS


@dataclass
class TurnSample:
    """One actor turn, as sampled, ready to be replayed with gradient.

    Exactly one of ``candidate_ids`` (score mode) and ``response_ids`` (generate mode) is set.

    Attributes:
        prompt_ids: the exact prompt token ids the policy saw (chat template applied; non-empty).
        advantage: the episode's advantage (e.g. from :func:`crl_agent.rl.split_group_advantages`).
        old_logprobs: log-probs under the sampling policy: one per response token in generate mode,
            ``log_softmax(logits / temperature)`` of each (a backend's ``Completion.sampling_logprobs``);
            a single value, the chosen action's ``log_softmax(scores / temperature)[chosen]``, in
            score mode.
        candidate_ids: score mode: each candidate action's token ids (its own tokens plus the
            end-of-turn token, as ``LLM.score_full`` returns them).
        chosen: score mode: index of the action taken.
        temperature: the softmax temperature the action (score mode) or each response token (generate
            mode) was sampled with; the learner recomputes the log-probs at it.
        norm: score mode: ``"sum"`` or ``"mean"`` of a candidate's token log-probs as its score.
        response_ids: generate mode: the generated token ids as sampled.
        policy_version: the learner version (updates applied) of the weights that sampled it.
        coef: the sample's loss coefficient (>= 0; see the module docstring). 1 by default: every
            sample weighs the same.
        behaviour_weight: ``pi / mu`` of the chosen action when it was sampled from a behaviour ``mu``
            other than the policy ``pi`` (``--explore`` mixes in uniform); it multiplies the
            policy-gradient term only (the KL and entropy terms are exact over the candidates). 1 on-policy.
        response_mask: generate mode: for each response token, whether the loss covers it: ``False`` for a
            token the model did not choose (a schema that allowed one token only, a closer picked
            deterministically: ``Completion.model_chosen``). ``None``: every token counts.
        learner_logprobs: the learner's own log-probs of what ``old_logprobs`` cover, under the weights
            that sampled it (version ``policy_version``), no gradient: filled in by
            :class:`~crl_agent.rl.PolicyLearner` on its first update at that version, so later epochs
            keep the same truncated importance weight against the engine's ``old_logprobs``.
    """

    prompt_ids: list[int]
    advantage: float
    old_logprobs: list[float]
    candidate_ids: list[list[int]] | None = None
    chosen: int | None = None
    temperature: float = 1.0
    norm: str = "sum"
    response_ids: list[int] | None = None
    policy_version: int = 0
    coef: float = 1.0
    behaviour_weight: float = 1.0
    response_mask: list[bool] | None = None
    learner_logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        self.prompt_ids = [int(t) for t in self.prompt_ids]
        self.old_logprobs = [float(x) for x in self.old_logprobs]
        if not self.prompt_ids:
            raise ValueError("a sample needs a non-empty prompt")
        if not math.isfinite(float(self.advantage)):
            raise ValueError(f"advantage must be finite, got {self.advantage}")
        self.coef, self.behaviour_weight = float(self.coef), float(self.behaviour_weight)
        if not (math.isfinite(self.coef) and self.coef >= 0):
            raise ValueError(f"coef must be finite and >= 0, got {self.coef}")
        if not (math.isfinite(self.behaviour_weight) and self.behaviour_weight >= 0):
            raise ValueError(f"behaviour_weight must be finite and >= 0, got {self.behaviour_weight}")
        if self.learner_logprobs is not None:
            self.learner_logprobs = [float(x) for x in self.learner_logprobs]
            if len(self.learner_logprobs) != len(self.old_logprobs) or not all(map(math.isfinite, self.learner_logprobs)):
                raise ValueError(f"learner_logprobs must be {len(self.old_logprobs)} finite values, one per old log-prob")
        if not all(math.isfinite(x) for x in self.old_logprobs):
            raise ValueError("old_logprobs must be finite")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if (self.candidate_ids is None) == (self.response_ids is None):
            raise ValueError("set exactly one of candidate_ids (score mode) and response_ids (generate mode)")
        if self.candidate_ids is not None:
            self.candidate_ids = [[int(t) for t in c] for c in self.candidate_ids]
            if not self.candidate_ids or any(not c for c in self.candidate_ids):
                raise ValueError("score mode needs at least one candidate, each with at least one token")
            if self.chosen is None or isinstance(self.chosen, bool) or not 0 <= int(self.chosen) < len(self.candidate_ids):
                raise ValueError(f"chosen must index one of the {len(self.candidate_ids)} candidates, got {self.chosen!r}")
            self.chosen = int(self.chosen)
            if len(self.old_logprobs) != 1:
                raise ValueError("score mode: old_logprobs holds the chosen action's single log-prob")
            if self.norm not in NORMS:
                raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        else:
            self.response_ids = [int(t) for t in self.response_ids]
            if len(self.old_logprobs) != len(self.response_ids):
                raise ValueError(
                    f"{len(self.old_logprobs)} old_logprobs for {len(self.response_ids)} response tokens"
                )
            if self.response_mask is not None:
                self.response_mask = [bool(m) for m in self.response_mask]
                if len(self.response_mask) != len(self.response_ids):
                    raise ValueError(f"{len(self.response_mask)} response_mask values for "
                                     f"{len(self.response_ids)} response tokens")

    @property
    def mode(self) -> str:
        """``"score"`` or ``"generate"``."""
        return "score" if self.candidate_ids is not None else "generate"

    @property
    def num_tokens(self) -> int:
        """Tokens a forward pass over this sample processes (the micro-batch budget's unit)."""
        if self.candidate_ids is not None:
            return len(self.prompt_ids) + sum(len(c) for c in self.candidate_ids)
        return len(self.prompt_ids) + len(self.response_ids or ())

    @property
    def num_loss_tokens(self) -> int:
        """Entries of this sample's row in the ``[B, T]`` loss (1 for a score-mode decision)."""
        return len(self.old_logprobs)
