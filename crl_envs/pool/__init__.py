"""Env pools: many envs in worker processes, with an async per-slot API."""

from __future__ import annotations

from crl_envs.pool.local import EnvError, EnvPool, SyncEnvPool

__all__ = ["EnvError", "EnvPool", "SyncEnvPool"]
