"""The env-slot interface every pool backend implements, and its one error type.

A pool holds a fixed list of envs, one per *slot*, and serves them through async calls, so
many episodes (LLM agents acting when their completion is ready) share one event loop::

    pool = make_pool(["crl/Sokoban-6x6-2-v0"] * 4, backend="inline")   # or "process", "ray"
    async with pool:
        obs, info = await pool.reset(0, seed=7)
        obs, reward, terminated, truncated, info = await pool.step(0, "up")
        move = await pool.call(0, "oracle_action")

Every backend gives the same results as the plain env on the same seeds and actions, and
fails the same way: any failure of an env call (the env raised, its worker died, the call ran
past its timeout, the pool was closed) is an :class:`EnvError` naming the env id, seed, slot
and cause. A slot whose episode was lost (its worker was restarted, or its hung env
abandoned) raises that error on every ``step``/``call`` until it is reset; no episode ever
continues silently on a fresh env. A slot index outside the pool is an ``IndexError``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


class EnvError(RuntimeError):
    """An env call failed: the env raised, its worker died, or the call timed out.

    Attributes:
        env_id: the slot's env id.
        seed: the seed of the episode that was hit (``None`` before its first reset).
        slot: the slot.
        cause: ``"exception"`` (the env raised, or its result could not be delivered),
            ``"crash"`` (its worker process or actor died), ``"timeout"``, ``"memory"``
            (its worker outgrew its memory limit) or ``"closed"`` (the pool was closed).
        detail: what happened, in words (the env's traceback for ``"exception"``).
    """

    def __init__(self, env_id: str, seed: int | None, slot: int, cause: str, detail: str):
        self.env_id, self.seed, self.slot, self.cause, self.detail = env_id, seed, slot, cause, detail
        super().__init__(f"{env_id} (slot {slot}, seed {seed}): {cause}: {detail}")

    def __reduce__(self) -> tuple:  # so it crosses process and Ray boundaries intact
        return type(self), (self.env_id, self.seed, self.slot, self.cause, self.detail)


@runtime_checkable
class SlotPool(Protocol):
    """What every env pool offers, whatever runs its envs (see the module docstring).

    Backends: :class:`~crl_envs.pool.inline.InlinePool` (threads of this process),
    :class:`~crl_envs.pool.process.ProcessPool` (worker processes) and
    :class:`~crl_envs.pool.ray_pool.RayEnvPool` (Ray actors); build one with
    :func:`crl_envs.pool.make_pool`. A pool is also an async context manager
    (``async with pool:`` starts it and closes it).
    """

    @property
    def num_slots(self) -> int:
        """How many slots (envs) the pool holds; ``len(pool)`` is the same."""
        ...

    def __len__(self) -> int: ...

    def env_id(self, slot: int) -> str:
        """The env id of ``slot``."""
        ...

    async def start(self) -> Any:
        """Create every env (the first call does it if you do not); returns the pool.

        Raises:
            EnvError: when an env cannot be created (the other slots still serve).
        """
        ...

    async def reset(self, slot: int, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple:
        """``env.reset(seed=seed, options=options)`` on one slot; returns ``(obs, info)``."""
        ...

    async def step(self, slot: int, action: str) -> tuple:
        """``env.step(action)`` on one slot; returns ``(obs, reward, terminated, truncated, info)``."""
        ...

    async def call(self, slot: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call a public method of the slot's unwrapped env, e.g. ``oracle_action``.

        ``reset``, ``step``, ``close`` and private names cannot be called this way.
        """
        ...

    def close(self) -> None:
        """Release every env, thread and process; calls in flight fail as ``"closed"``. Safe to repeat."""
        ...


def check_slot(slot: Any, num_slots: int) -> None:
    """Raise ``IndexError`` unless ``slot`` is an ``int`` in ``0..num_slots - 1`` (never another slot)."""
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < num_slots:
        raise IndexError(f"slot {slot!r} does not exist; this pool has slots 0..{num_slots - 1}")
