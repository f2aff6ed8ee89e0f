"""Env pools: many envs in worker processes, with an async per-slot API."""

from __future__ import annotations

from crl_envs.pool.local import EnvError, EnvPool, SyncEnvPool
from crl_envs.pool.vector import PoolVectorEnv

__all__ = ["EnvError", "EnvPool", "PoolVectorEnv", "SyncEnvPool"]
