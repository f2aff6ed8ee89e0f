"""``random``: uniform over the admissible actions (a floor for every leaderboard)."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from crl_agent.agents.base import Agent, Policy
from crl_agent.episode import EpisodeContext

FALLBACK_VOCABULARY = ("look", "inventory", "north", "south", "east", "west", "up", "down", "left", "right")


class RandomPolicy(Policy):
    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    async def act(self, obs: str, info: dict[str, Any]) -> str:
        choices = info.get("admissible_actions") or info.get("action_vocabulary") or FALLBACK_VOCABULARY
        return str(choices[int(self.rng.integers(len(choices)))])


class RandomAgent(Agent):
    """Picks uniformly among admissible actions, else among the env's action vocabulary.

    Args:
        seed: combined with the env id and episode seed, so runs are reproducible.
    """

    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def make_policy(self, ctx: EpisodeContext) -> Policy:
        key = [self.seed, zlib.crc32(ctx.env_id.encode()), ctx.seed & 0xFFFFFFFF]
        if ctx.sample:  # sample 0 keeps the streams of runs recorded before samples existed
            key.append(ctx.sample)
        return RandomPolicy(np.random.default_rng(key))

    def config(self) -> dict[str, Any]:
        return {**super().config(), "seed": self.seed}
