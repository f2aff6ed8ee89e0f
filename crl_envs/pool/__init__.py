"""Env pools: many envs in worker processes, with an async per-slot API."""

from __future__ import annotations

from crl_envs.pool.local import EnvError, EnvPool, SyncEnvPool
from crl_envs.pool.vector import PoolVectorEnv

__all__ = ["EnvError", "EnvPool", "PoolVectorEnv", "SyncEnvPool", "make_pool"]

BACKENDS = ("process", "ray")


def make_pool(envs, backend: str = "process", **kwargs):
    """An env pool on worker processes (``"process"``) or Ray actors (``"ray"``); same async API."""
    if backend == "process":
        return EnvPool(envs, **kwargs)
    if backend == "ray":
        from crl_envs.pool.ray_pool import RayEnvPool

        return RayEnvPool(envs, **kwargs)
    raise ValueError(f"unknown pool backend {backend!r}; use one of {BACKENDS}")
