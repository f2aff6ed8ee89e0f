"""Episodes as data: what a policy knows before an episode (:class:`EpisodeContext`), each step
(:class:`Step`, with the :class:`ScoredTurn` decisions a scoring policy made) and the finished episode
(:class:`Episode`).

A leaf module (it imports nothing of crl_agent): agents (:mod:`crl_agent.agents.base`), the rollout
loop (:mod:`crl_agent.rollout`), the trainer and the eval harness all speak these types. Episodes
are keyed ``env_id#seed#sample``: ``sample`` numbers the rollouts of one seed (GRPO groups, pass@k
evaluation).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

SUMMARY_FIELDS = ("env_id", "seed", "sample", "success", "progress", "reward", "actions", "invalid_actions",
                  "terminated", "truncated", "wall_time_s", "error", "tokens_in", "tokens_out", "extra")
_UNRECORDED_STEP_FIELDS = ("scored", "tool_choices")  # typed decisions: the turn trace records them


def episode_key(env_id: str, seed: int, sample: int = 0) -> str:
    """The key of one episode: ``env_id#seed#sample``."""
    return f"{env_id}#{seed}#{sample}"


@dataclass
class EpisodeContext:
    """What a policy may know about its episode before the first observation.

    Attributes:
        env_id: the Gymnasium id.
        seed: the episode's reset seed.
        episode_index: index of the episode within its task.
        sample: which rollout of this seed (0, 1, ...): GRPO groups and pass@k play one seed several
            times; policies mix it into their sampling seed so the samples differ.
        with_experience: whether a policy that can use test-time experience (the ``crl`` agent) uses it in
            this episode; Complementary RL's split groups play half their rollouts without it.
        distil: whether an agent that learns from finished episodes (the ``crl`` agent's extractor)
            distils this one; its outcome still credits the experience that guided it (a trainer on a
            small budget distils a subset of each group).
        oracle: coroutine returning the env's solver action for the current state;
            only for the ``oracle`` agent (``None`` where the env has no solver).
        explore: for a policy that samples its actions (the ``llm`` agent in score mode): sample from
            ``(1 - explore) * policy + explore * uniform`` in this episode (RL training rollouts);
            ``None``: the agent's own setting.
        learning: whether an agent that learns from finished episodes (the ``crl`` agent) learns from
            this one (distils it, credits the experience that guided it); a trainer's held-out
            evaluation plays with ``False``, so the bank and the extractor's rewards never see it.
    """

    env_id: str
    seed: int
    episode_index: int = 0
    sample: int = 0
    with_experience: bool = True
    distil: bool = True
    oracle: Callable[..., Awaitable[str]] | None = None
    explore: float | None = None
    learning: bool = True


@dataclass
class ScoredTurn:
    """One decision made by scoring the admissible actions (GLAM: a softmax over their log-probs as
    replies), as the policy sampled it: what a trainer learns from (:func:`crl_agent.rl.turn_samples`).
    Its :meth:`trace` is what the episode's trajectory records of it.

    Attributes:
        candidates: the texts scored (the admissible actions, then any tool candidates, e.g. the ``crl``
            agent's ``<search>``); a decision that chose a tool is one of its step's ``tool_choices``.
        logprobs: each candidate's score (normalised as ``score_norm`` says).
        probs: the policy's probability of each, ``softmax(logprobs / temperature)``.
        chosen: the index picked.
        action_logprob: the policy's own log-prob of it (PPO's old log-prob).
        behaviour_logprob: its log-prob under what it was sampled from (``explore`` mixes in uniform).
        temperature, score_norm: how the scores became ``probs``.
        policy_version: the weights that scored it.
        prompt_token_ids, candidate_token_ids: the exact ids scored (never re-tokenised).
    """

    candidates: list[str]
    logprobs: list[float]
    probs: list[float]
    chosen: int
    action_logprob: float
    behaviour_logprob: float
    temperature: float
    score_norm: str
    policy_version: int
    prompt_token_ids: list[int]
    candidate_token_ids: list[list[int]]

    def trace(self) -> dict[str, Any]:
        """The turn trace fields of this decision (see ``eval/trajectories.py``)."""
        return {
            "candidates": [{"text": c, "logprob": lp, "prob": p}
                           for c, lp, p in zip(self.candidates, self.logprobs, self.probs, strict=True)],
            "chosen": self.chosen,
            "action_logprob": self.action_logprob,
            "behaviour_logprob": self.behaviour_logprob,
            "temperature": self.temperature,
            "score_norm": self.score_norm,
            "policy_version": self.policy_version,
            "prompt_token_ids": self.prompt_token_ids,
            "candidate_token_ids": self.candidate_token_ids,
        }

    def choice_trace(self) -> dict[str, Any]:
        """A tool choice as the turn trace lists it under ``tool_choices``: :meth:`trace` without the token
        ids (text-mode trajectories drop those only at the top of a turn)."""
        return {k: v for k, v in self.trace().items() if k not in ("prompt_token_ids", "candidate_token_ids")}


@dataclass
class Step:
    """One ``env.step`` of an episode, with the observation it answered."""

    t: int
    observation: str
    admissible_actions: list[str] | None
    action: str
    reward: float
    valid_action: bool
    terminated: bool
    truncated: bool
    success: bool
    progress: float
    info: dict[str, Any] = field(default_factory=dict)
    turn: dict[str, Any] | None = None
    scored: ScoredTurn | None = None  # the decision, typed, when the policy scored the actions (not recorded:
    # ``turn`` holds its trace)
    tool_choices: list[ScoredTurn] = field(default_factory=list)  # scored decisions before ``scored`` that chose
    # a tool (search-and-ask), in order (not recorded: ``turn["tool_choices"]`` holds their traces)

    @property
    def decisions(self) -> list[ScoredTurn]:
        """Every scored decision of this step, in order: the tool choices, then the one that picked the action."""
        return [*self.tool_choices, *([self.scored] if self.scored is not None else [])]


@dataclass
class Episode:
    """A finished (or errored) episode: its summary fields, its steps and its final observation.

    The summary fields are what ``episodes.jsonl`` records (:meth:`summary`); agents written for the
    former ``EpisodeResult`` read the same attributes (``success``, ``progress``, ``extra``...).
    """

    env_id: str
    seed: int
    sample: int = 0
    success: bool = False
    progress: float = 0.0
    reward: float = 0.0
    actions: int = 0
    invalid_actions: int = 0
    terminated: bool = False
    truncated: bool = False
    wall_time_s: float = 0.0
    error: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    task: str = ""
    agent: str = ""
    steps: list[Step] = field(default_factory=list)
    final_observation: str = ""

    @property
    def key(self) -> str:
        return episode_key(self.env_id, self.seed, self.sample)

    def summary(self) -> dict[str, Any]:
        """The ``episodes.jsonl`` fields (no steps)."""
        return {k: getattr(self, k) for k in SUMMARY_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready (the trajectory record before any text-mode capping).

        Shallow: the steps become new dicts, but their ``info`` and ``turn`` dicts are the episode's own
        (``dataclasses.asdict``'s deep copy cost 9 ms per 100-step episode).
        """
        out = {k: getattr(self, k) for k in (*SUMMARY_FIELDS, "task", "agent", "final_observation")}
        out["steps"] = [{k: v for k, v in vars(s).items() if k not in _UNRECORDED_STEP_FIELDS} for s in self.steps]
        return out


# The former name of the episode summary; kept so agents written against it still import.
EpisodeResult = Episode
