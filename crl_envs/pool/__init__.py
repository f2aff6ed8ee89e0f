"""Env pools: many envs behind one async per-slot interface, on three backends.

* ``"inline"`` (:class:`InlinePool`): envs in this process, each called from its own thread,
  so a slow step never blocks the event loop;
* ``"process"`` (:class:`ProcessPool`, also importable as ``EnvPool``, its older name):
  envs in worker processes that are killed and restarted when they crash or hang;
* ``"ray"`` (:class:`~crl_envs.pool.ray_pool.RayEnvPool`): envs on Ray actors, for runs that
  span machines.

All three implement :class:`SlotPool` (see :mod:`crl_envs.pool.base`) and fail with
:class:`EnvError`; :func:`make_pool` builds one by name.
"""

from __future__ import annotations

from typing import Any

from crl_envs.pool.base import EnvError, SlotPool
from crl_envs.pool.inline import InlinePool
from crl_envs.pool.process import EnvPool, ProcessPool, SyncEnvPool
from crl_envs.pool.vector import PoolVectorEnv

__all__ = ["BACKENDS", "EnvError", "EnvPool", "InlinePool", "PoolVectorEnv", "ProcessPool", "SlotPool",
           "SyncEnvPool", "make_pool"]

BACKENDS = ("inline", "process", "ray")


def make_pool(
    envs: list[tuple[str, dict[str, Any]] | str],
    backend: str = "process",
    *,
    num_workers: int | None = None,
    timeout: float = 60.0,
    reset_timeout: float = 300.0,
    **options: Any,
) -> SlotPool:
    """An env pool on one of :data:`BACKENDS`; every backend has the same :class:`SlotPool` API.

    Args:
        envs: ``(env_id, make_kwargs)`` pairs (or bare ids), one per slot.
        backend: ``"inline"`` (threads of this process), ``"process"`` (worker processes) or
            ``"ray"`` (Ray actors).
        num_workers: worker processes or actors the slots are spread over (default: one per slot,
            at most 2); ignored by ``"inline"``, which gives every slot its own thread.
        timeout: seconds a ``step``/``call`` may run before it fails with cause ``"timeout"``.
        reset_timeout: the same for ``reset`` and env creation.
        **options: backend-specific options, e.g. ``max_worker_rss_mb`` (process) or
            ``threads=False`` (inline; see :class:`InlinePool`).

    Raises:
        ValueError: for an unknown backend.
        gymnasium.error.NameNotFound, gymnasium.error.DependencyNotInstalled: for an unknown id
            or a family whose backend is not installed (checked before anything starts).
    """
    if backend == "inline":
        return InlinePool(envs, timeout=timeout, reset_timeout=reset_timeout, **options)
    if backend == "process":
        return ProcessPool(envs, num_workers=num_workers, timeout=timeout, reset_timeout=reset_timeout, **options)
    if backend == "ray":
        from crl_envs.pool.ray_pool import RayEnvPool

        return RayEnvPool(envs, num_workers=num_workers, timeout=timeout, reset_timeout=reset_timeout, **options)
    raise ValueError(f"unknown pool backend {backend!r}; use one of {BACKENDS}")
