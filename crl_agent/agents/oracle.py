"""``oracle``: follows each family's solver (BFS, planner or gold patch).

It proves every generated instance is solvable and that the reward is right.
"""

from __future__ import annotations

from typing import Any

from crl_agent.agents.base import Agent, Policy
from crl_agent.episode import EpisodeContext


class OracleUnavailable(RuntimeError):
    """The env has no solver."""


class OraclePolicy(Policy):
    def __init__(self, ctx: EpisodeContext):
        if ctx.oracle is None:
            raise OracleUnavailable(f"{ctx.env_id} has no solver; the oracle agent cannot play it")
        self._oracle = ctx.oracle

    async def act(self, obs: str, info: dict[str, Any]) -> str:
        return await self._oracle()


class OracleAgent(Agent):
    name = "oracle"
    needs_solver = True

    def make_policy(self, ctx: EpisodeContext) -> Policy:
        return OraclePolicy(ctx)
