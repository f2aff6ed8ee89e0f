"""A ``gymnasium.vector.VectorEnv`` over an :class:`EnvPool`, for lockstep users.

Autoreset is explicit: ``metadata["autoreset_mode"]`` is ``AutoresetMode.NEXT_STEP``, as in
Gymnasium's own vector envs: the step after a sub-env ends resets it (its action is ignored)
and returns the first observation of the new episode with reward 0.
Observations are tuples of strings; there is no shared memory for text.

A sub-env whose call fails in the pool (its worker crashed or timed out, or the env raised)
does not take the batch down: its episode ends as *truncated* with reward 0, the
observation says what happened, ``infos["env_error"]`` holds the :class:`EnvError` text, and
the next step autoresets it. The other sub-envs' results of that step are returned as usual.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from gymnasium.spaces import Tuple
from gymnasium.vector import AutoresetMode, VectorEnv

from crl_envs.pool.base import EnvError
from crl_envs.pool.process import EnvPool


class PoolVectorEnv(VectorEnv):
    """``num_envs`` copies of one env id stepped in lockstep through worker processes.

    Args:
        env_id: a registered id.
        num_envs: sub-envs.
        num_workers: worker processes (default: ``min(2, num_envs)``).
        make_kwargs: kwargs for ``gymnasium.make``.
        timeout: per-call timeout in seconds.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        num_workers: int | None = None,
        make_kwargs: dict[str, Any] | None = None,
        timeout: float = 60.0,
    ):
        import gymnasium as gym

        self._loop = asyncio.new_event_loop()
        self.pool = EnvPool([(env_id, make_kwargs or {})] * num_envs, num_workers=num_workers, timeout=timeout)
        self._loop.run_until_complete(self.pool.start())
        probe = gym.make(env_id, **(make_kwargs or {}))
        self.num_envs = num_envs
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        probe.close()
        self.observation_space = Tuple([self.single_observation_space] * num_envs)
        self.action_space = Tuple([self.single_action_space] * num_envs)
        self.spec = gym.spec(env_id)
        self._autoreset = np.zeros(num_envs, dtype=bool)

    def _gather(self, coros, return_exceptions: bool = False):
        async def run():
            return await asyncio.gather(*coros, return_exceptions=return_exceptions)

        return self._loop.run_until_complete(run())

    @staticmethod
    def _errored(e: EnvError):
        """A failed sub-env step as a truncated episode that reports the error."""
        info = {"env_error": str(e), "valid_action": False, "success": False, "progress": 0.0}
        return f"The environment failed ({e.cause}); this episode is over and the next step starts a new one.", \
            0.0, False, True, info

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"need {self.num_envs} seeds, got {len(seeds)}")
        outs = self._gather(self.pool.reset(i, s, options) for i, s in enumerate(seeds))
        self._autoreset[:] = False
        infos: dict[str, Any] = {}
        for i, (_, info) in enumerate(outs):
            infos = self._add_info(infos, info, i)
        return tuple(o for o, _ in outs), infos

    def step(self, actions):
        if len(actions) != self.num_envs:
            raise ValueError(f"need {self.num_envs} actions, got {len(actions)}")

        async def one(i: int, action: str):
            if self._autoreset[i]:
                obs, info = await self.pool.reset(i)
                return obs, 0.0, False, False, info
            return await self.pool.step(i, action)

        outs = self._gather((one(i, a) for i, a in enumerate(actions)), return_exceptions=True)
        for i, o in enumerate(outs):
            if isinstance(o, EnvError):
                outs[i] = self._errored(o)
            elif isinstance(o, BaseException):
                raise o
        obs = tuple(o[0] for o in outs)
        rewards = np.array([o[1] for o in outs], dtype=np.float64)
        terminated = np.array([o[2] for o in outs], dtype=bool)
        truncated = np.array([o[3] for o in outs], dtype=bool)
        infos: dict[str, Any] = {}
        for i, o in enumerate(outs):
            infos = self._add_info(infos, o[4], i)
        self._autoreset = terminated | truncated
        return obs, rewards, terminated, truncated, infos

    def close_extras(self, **kwargs: Any) -> None:
        if not self._loop.is_closed():
            self.pool.close()
            self._loop.run_until_complete(asyncio.sleep(0))  # let cancelled tasks finish
            self._loop.close()
