"""A CPU-heavy Sokoban for the pool benchmark: each step also re-solves the level (no sleeping)."""

from __future__ import annotations

from crl_envs.sokoban.env import SokobanEnv
from crl_envs.sokoban.solver import solve


class HeavySokoban(SokobanEnv):
    def step(self, action):
        for _ in range(40):
            solve(list(self._walls), self._targets, self._boxes, self._player, self.size)
        return super().step(action)
