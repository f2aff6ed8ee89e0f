"""Slot bookkeeping shared by every pool backend: which env each slot holds, and lost episodes.

A backend hosts its envs in *hosts* (a worker process, a Ray actor, a thread); ``host`` is
a slot's host index. When a host is replaced (it crashed, hung or outgrew its memory) every
episode it was running is *lost*: its slot answers only a fresh start (``reset``) until
then, and every other call fails with the cause of the loss. An episode counts as running
from the moment its ``reset`` is sent, so a host that dies while the reply is on its way
cannot leave the new episode silently on a fresh env.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from crl_envs.pool.base import EnvError, check_slot
from crl_envs.registry import check_env_id

FRESH_START_METHODS = ("reset", "make")  # the calls a lost episode still accepts (they start afresh)
RESERVED_METHODS = ("make", "reset", "step", "close")  # served by the pool itself, never through ``call``
STEP_LIMIT_MARGIN_S = 30.0  # beyond an env's declared step_time_limit_s before a step counts as hung


def parse_envs(envs: list[tuple[str, dict[str, Any]] | str]) -> list[tuple[str, dict[str, Any]]]:
    """Normalise ``envs`` to ``(env_id, kwargs)`` pairs, checking every id up front."""
    if isinstance(envs, (str, dict)):
        raise TypeError(f"envs must be a list of env ids or (env_id, kwargs) pairs, one per slot; got {envs!r}")
    pairs = []
    for e in envs:
        if isinstance(e, str):
            pairs.append((e, {}))
        elif isinstance(e, (tuple, list)) and len(e) == 2 and isinstance(e[0], str) and isinstance(e[1], dict):
            pairs.append((e[0], dict(e[1])))
        else:
            raise TypeError(f"each env is an id or an (env_id, kwargs) pair; got {e!r}")
    if not pairs:
        raise ValueError("a pool needs at least one env")
    for env_id, _ in pairs:
        check_env_id(env_id)
    return pairs


def check_method(method: Any) -> None:
    """Raise ``ValueError`` unless ``method`` may go through ``pool.call`` (a public env method)."""
    if not isinstance(method, str) or not method.isidentifier() or method.startswith("_"):
        raise ValueError(f"{method!r} cannot be called through the pool: name a public method of the env")
    if method in RESERVED_METHODS:
        raise ValueError(f"{method!r} cannot be called through pool.call: use pool.{method}() "
                         "(make and close are the pool's own)")


@dataclass
class Slot:
    """One env of a pool and the state of its episode."""

    env_id: str
    kwargs: dict[str, Any]
    spec: gym.envs.registration.EnvSpec
    host: int
    seed: int | None = None
    active: bool = False  # an episode is running (its reset was sent)
    lost: tuple[str, str] | None = None  # (cause, detail) when its host was replaced mid-episode
    step_limit_s: float | None = None  # what its env declares one step may take (``TextEnv.step_time_limit_s``)


class SlotTable:
    """The slots of a pool, spread round-robin over ``num_hosts`` hosts.

    Args:
        envs: ``(env_id, make_kwargs)`` pairs (or bare ids), one per slot (see :func:`parse_envs`).
        num_hosts: how many hosts share the slots.
        host_word: what a host is, for error messages (``"worker"``, ``"actor"``, ``"thread"``).
    """

    def __init__(self, envs: list[tuple[str, dict[str, Any]]], num_hosts: int, host_word: str):
        pairs = parse_envs(envs)
        self.num_hosts = num_hosts
        self.host_word = host_word
        self.slots = [Slot(i, kw, gym.spec(i), n % num_hosts) for n, (i, kw) in enumerate(pairs)]

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, slot: int) -> Slot:
        return self.slots[slot]

    def check(self, slot: Any) -> Slot:
        """The slot, or ``IndexError`` for an index outside the pool."""
        check_slot(slot, len(self.slots))
        return self.slots[slot]

    def specs(self, host: int) -> dict[int, tuple[gym.envs.registration.EnvSpec, dict[str, Any]]]:
        """``{slot: (spec, kwargs)}`` of the envs ``host`` holds."""
        return {n: (s.spec, s.kwargs) for n, s in enumerate(self.slots) if s.host == host}

    def timeout(self, slot: int, timeout: float) -> float:
        """The timeout of a ``step``/``call`` on ``slot``: ``timeout``, or more where its env declares a
        longer legitimate step (SWE grades a whole test run inside ``submit``), so that is never killed."""
        limit = self.check(slot).step_limit_s
        return timeout if limit is None else max(timeout, limit + STEP_LIMIT_MARGIN_S)

    def made(self, slot: int, step_limit_s: float | None) -> None:
        """Record what a freshly made env of ``slot`` declared."""
        self.slots[slot].step_limit_s = step_limit_s

    def error(self, slot: int, cause: str, detail: str) -> EnvError:
        s = self.slots[slot]
        return EnvError(s.env_id, s.seed, slot, cause, detail)

    def begin(self, slot: int, method: str) -> None:
        """Account for a call about to be sent; raise the slot's loss unless the call starts afresh."""
        s = self.slots[slot]
        if s.lost is not None and method not in FRESH_START_METHODS:
            cause, detail = s.lost
            raise self.error(slot, cause, f"the {self.host_word} hosting this episode was restarted ({detail}); "
                                          "reset the slot to start a new episode")
        if method == "reset":
            # Running from the moment it is sent: a host replaced while the reply is on its way (or
            # while the caller waits to resume) must mark this new episode lost.
            s.active, s.lost = True, None

    def lose(self, host: int, cause: str, detail: str) -> None:
        """``host`` is being replaced: every episode it was running is lost until its slot is reset."""
        for s in self.slots:
            if s.host == host and s.active:
                s.active, s.lost = False, (cause, detail)


class SlotFront:
    """The per-slot API the three pools share, written once over each pool's own ``_request``.

    A pool sets ``slots`` (:class:`SlotTable`), ``timeout`` and ``reset_timeout``, and implements
    ``start()``, ``close()`` and ``_request(slot, method, args, timeout, kwargs)``.
    """

    slots: SlotTable
    timeout: float
    reset_timeout: float
    _started: bool
    _closed: bool

    async def reset(self, slot: int, seed: int | None = None, options: dict[str, Any] | None = None):
        """``env.reset`` on one slot; returns ``(obs, info)``."""
        self.slots.check(slot).seed = seed
        return await self._request(slot, "reset", (seed, options), self.reset_timeout)

    async def step(self, slot: int, action: str):
        """``env.step`` on one slot; returns ``(obs, reward, terminated, truncated, info)``."""
        return await self._request(slot, "step", (action,), self.slots.timeout(slot, self.timeout))

    async def call(self, slot: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call a public method of the slot's unwrapped env, e.g. ``oracle_action``."""
        self.slots.check(slot)
        check_method(method)
        return await self._request(slot, method, args, self.slots.timeout(slot, self.timeout), kwargs)

    async def _admit(self, slot: int, method: str) -> Slot:
        """What a request passes before it is sent: a valid slot, a started, open pool, and the slot's
        episode bookkeeping (a call on a lost episode raises its loss)."""
        s = self.slots.check(slot)
        if not self._started:
            await self.start()
        if self._closed:
            raise self.slots.error(slot, "closed", "the pool was closed")
        self.slots.begin(slot, method)
        return s

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def num_slots(self) -> int:
        return len(self.slots)

    def env_id(self, slot: int) -> str:
        return self.slots.check(slot).env_id

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        self.close()
