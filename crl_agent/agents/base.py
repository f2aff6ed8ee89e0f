"""The agent interface that the eval harness drives.

An :class:`Agent` makes one :class:`Policy` per episode. The harness calls the
policy's async :meth:`Policy.act` with each observation and ``info`` dict, and tells
the agent how the episode ended through :meth:`Agent.on_episode_end`. Episodes run
concurrently on asyncio, so a policy keeps its state on itself, never on the agent.

A minimal third-party agent::

    class FirstAction(Agent):
        name = "first"

        def make_policy(self, ctx):
            return FirstActionPolicy()

    class FirstActionPolicy(Policy):
        async def act(self, obs, info):
            return (info["admissible_actions"] or ["look"])[0]
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crl_agent.rollout import Episode


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
    """

    env_id: str
    seed: int
    episode_index: int = 0
    sample: int = 0
    with_experience: bool = True
    distil: bool = True
    oracle: Callable[[], Awaitable[str]] | None = None


class Policy(abc.ABC):
    """Acts within one episode."""

    @abc.abstractmethod
    async def act(self, obs: str, info: dict[str, Any]) -> str:
        """Return the next action for this observation."""

    def turn_trace(self) -> dict[str, Any] | None:
        """What to record about the last :meth:`act` in the episode's trajectory (``None``: nothing).

        LLM policies return the messages sent, the reply, token ids and log-probs, scored candidates...
        (see the trajectory schema in ``eval/trajectories.py``). Called once right after each ``act``.
        """
        return None

    def usage(self) -> dict[str, int]:
        """Token counts for this episode (``tokens_in``, ``tokens_out``)."""
        return {"tokens_in": 0, "tokens_out": 0}


class Agent(abc.ABC):
    """Makes a policy per episode and learns (or not) from finished episodes.

    Set ``needs_solver = True`` on an agent that calls ``ctx.oracle``: ``eval.run`` then refuses,
    before playing, a task whose env has no solver.
    """

    name: str = "agent"
    needs_solver: bool = False

    @abc.abstractmethod
    def make_policy(self, ctx: EpisodeContext) -> Policy:
        """A fresh policy for the episode ``ctx`` describes."""

    def on_episode_end(self, ctx: EpisodeContext, episode: Episode) -> None:  # noqa: B027 - optional hook
        """Called once per finished (or errored) episode, with all of it (:class:`crl_agent.rollout.Episode`).

        Fields added to ``episode.extra`` here (numbers) are recorded and averaged per task.
        """

    def config(self) -> dict[str, Any]:
        """A JSON-serialisable description, recorded in ``summary.json``."""
        return {"name": self.name, "class": f"{type(self).__module__}:{type(self).__qualname__}"}

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release resources (servers, models) at the end of a run."""
