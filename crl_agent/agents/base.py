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
from typing import Any

from crl_agent.episode import Episode, EpisodeContext, ScoredTurn

__all__ = ["Agent", "EpisodeContext", "Policy"]  # EpisodeContext: its home is crl_agent.episode


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

    def scored_turn(self) -> ScoredTurn | None:
        """The last :meth:`act`'s decision when it was made by scoring the admissible actions (what a
        trainer learns from), else ``None``. Called once right after each ``act``, beside :meth:`turn_trace`."""
        return None

    def tool_choices(self) -> list[ScoredTurn]:
        """The last :meth:`act`'s scored decisions that chose a tool (e.g. search-and-ask) before the one
        :meth:`scored_turn` returns, in order (a trainer learns when a tool pays from them); ``[]`` for
        none. Called once right after each ``act``, beside :meth:`scored_turn`."""
        return []

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
