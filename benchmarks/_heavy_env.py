"""A CPU-heavy Sokoban for the pool benchmark: each step burns a fixed amount of CPU (no sleeping).

The cost is the same on every level, so workers get balanced loads.
"""

from __future__ import annotations

from crl_envs.sokoban.env import SokobanEnv


class HeavySokoban(SokobanEnv):
    def step(self, action):
        s = 0
        for i in range(60_000):  # a few ms of pure-Python work
            s += i * i
        return super().step(action)
