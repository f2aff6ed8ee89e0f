"""Episodes as data: the one rollout loop that evaluation (``eval.run``) and training share.

:func:`run_episode` plays one episode of an :class:`EnvSlot` (an env in this process, a pool slot,
anything with async ``reset``/``step``) with an agent's policy and returns an :class:`Episode`:

- per step the observation the policy acted on, the admissible actions, the action, the reward,
  ``valid_action``, ``terminated``/``truncated``, success and progress, the JSON-safe rest of
  ``info``, and the policy's **turn trace** (what :meth:`Policy.turn_trace` returned after that
  action: for the ``llm``/``crl`` agents the messages as sent, the raw reply, token ids and
  log-probs, scored candidates, experience shown, searches) and, for a scoring policy, its
  :class:`~crl_agent.episode.ScoredTurn` (:meth:`Policy.scored_turn`, and :meth:`Policy.tool_choices`
  for its decisions to call a tool first: what a trainer learns from);
- the final observation, and the summary the harness records in ``episodes.jsonl``.

:func:`play` drives many episodes at once on an env pool (:func:`open_pool`), each on a free slot of
its env id: ``eval.run`` and the trainer both play through it. The types (:class:`Episode`,
:class:`Step`, :class:`EpisodeContext`) live in :mod:`crl_agent.episode` and are re-exported here.

Any exception (agent bug, env crash, pool timeout) ends the episode as *errored*: the steps played
so far are kept and ``error`` says what happened. Values that JSON cannot hold in ``info`` or in a
turn trace are replaced by their ``repr`` with a warning naming the field, so a policy's odd trace
never loses the episode. The agent's :meth:`Agent.on_episode_end` receives the whole episode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
import traceback
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from crl_agent.agents.base import Agent
from crl_agent.episode import SUMMARY_FIELDS, Episode, EpisodeContext, EpisodeResult, ScoredTurn, Step, episode_key

__all__ = ["SUMMARY_FIELDS", "CallableSlot", "EnvSlot", "Episode", "EpisodeContext", "EpisodeResult", "PoolSlot", "ScoredTurn", "Step",
           "episode_key", "json_safe", "open_pool", "play", "run_episode"]

STEP_INFO_KEYS = ("valid_action", "success", "progress", "admissible_actions")


class EnvSlot(Protocol):
    """What :func:`run_episode` needs from an env: async ``reset`` and ``step``."""

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]: ...

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]: ...


def json_safe(value: Any, where: str = "value", _depth: int = 0) -> Any:
    """``value`` with everything JSON cannot hold replaced; warns naming each replaced field.

    numpy scalars and arrays become numbers and lists; non-finite floats stay (JSON's NaN); tuples
    and sets become lists; anything else becomes its ``repr``.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):  # NaN and infinities too: json writes them and our loaders read them
        return value
    if _depth > 32:
        warnings.warn(f"{where}: nested too deep for a trajectory; stored as its repr", stacklevel=2)
        return repr(value)[:10_000]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            key = k if isinstance(k, str) else str(k)
            out[key] = json_safe(v, f"{where}.{key}", _depth + 1)
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v, f"{where}[{i}]", _depth + 1) for i, v in enumerate(value)]
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays, torch tensors
    if callable(tolist):
        try:
            return json_safe(tolist(), where, _depth + 1)
        except Exception:  # noqa: BLE001 - fall through to repr
            pass
    warnings.warn(f"{where}: {type(value).__name__} is not JSON-serialisable; stored as its repr", stacklevel=2)
    return repr(value)[:10_000]


def _trace_of(policy: Any, where: str) -> dict[str, Any] | None:
    trace_fn = getattr(policy, "turn_trace", None)
    if trace_fn is None:
        return None
    trace = trace_fn()
    if trace is None:
        return None
    if not isinstance(trace, dict):
        trace = {"trace": trace}
    return json_safe(trace, where)


def _scored_of(policy: Any) -> ScoredTurn | None:
    scored_fn = getattr(policy, "scored_turn", None)
    scored = scored_fn() if scored_fn is not None else None
    return scored if isinstance(scored, ScoredTurn) else None


def _tool_choices_of(policy: Any) -> list[ScoredTurn]:
    choices_fn = getattr(policy, "tool_choices", None)
    choices = choices_fn() if choices_fn is not None else None
    return [c for c in choices or () if isinstance(c, ScoredTurn)]


async def run_episode(
    env: EnvSlot,
    agent: Agent,
    ctx: EpisodeContext,
    *,
    on_step: Callable[[Step], None] | None = None,
) -> Episode:
    """Play one episode of ``env`` with ``agent``'s policy for ``ctx`` and return it as data.

    Args:
        env: the env or pool slot (``reset(seed)``, ``step(action)``, both async).
        agent: makes the policy (``agent.make_policy(ctx)``) and hears the end (``on_episode_end``).
        ctx: which episode (env id, seed, sample, oracle hook).
        on_step: called after each step (progress bars).

    Returns:
        The episode; an exception anywhere ends it as errored (never raised).
    """
    ep = Episode(env_id=ctx.env_id, seed=ctx.seed, sample=ctx.sample, agent=getattr(agent, "name", ""))
    t0 = time.perf_counter()
    info: dict[str, Any] = {}
    policy = None
    try:
        obs, info = await env.reset(ctx.seed)
        ep.task = str(info.get("task") or "")
        ep.final_observation = obs
        policy = agent.make_policy(ctx)
        while not (ep.terminated or ep.truncated):
            pending = policy.act(obs, info)
            if not inspect.isawaitable(pending):
                raise TypeError(f"{type(policy).__qualname__}.act returned {type(pending).__name__}, not an awaitable: "
                                "declare it `async def act(self, obs, info)`")
            action = await pending
            where = f"{ctx.env_id}#{ctx.seed}#{ctx.sample} step {len(ep.steps)}"
            turn = _trace_of(policy, f"{where} turn")
            scored, tool_choices = _scored_of(policy), _tool_choices_of(policy)
            admissible = info.get("admissible_actions")
            prev_obs = obs
            obs, reward, term, trunc, info = await env.step(action)
            valid = bool(info.get("valid_action", True))
            step = Step(
                t=len(ep.steps),
                observation=prev_obs,
                admissible_actions=list(admissible) if isinstance(admissible, (list, tuple)) else None,
                action=action if isinstance(action, str) else repr(action),
                reward=float(reward),
                valid_action=valid,
                terminated=bool(term),
                truncated=bool(trunc),
                success=bool(info.get("success", False)),
                progress=float(info.get("progress", 0.0)),
                info=json_safe({k: v for k, v in info.items() if k not in STEP_INFO_KEYS}, f"{where} info"),
                turn=turn,
                scored=scored,
                tool_choices=tool_choices,
            )
            ep.steps.append(step)
            ep.final_observation = obs
            ep.actions += 1
            ep.invalid_actions += not valid
            ep.reward += step.reward
            ep.terminated, ep.truncated = step.terminated, step.truncated
            if on_step is not None:
                on_step(step)
    except Exception as e:  # noqa: BLE001 - an episode's failure is recorded, not raised
        ep.error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
    usage = policy.usage() if policy is not None else {}
    ep.success = bool(info.get("success", False)) and ep.error is None
    ep.progress = float(info.get("progress", 0.0)) if ep.error is None else 0.0
    ep.wall_time_s = time.perf_counter() - t0
    ep.tokens_in, ep.tokens_out = int(usage.get("tokens_in", 0)), int(usage.get("tokens_out", 0))
    try:
        agent.on_episode_end(ctx, ep)
    except Exception as e:  # noqa: BLE001
        ep.error = (ep.error or "") + f"on_episode_end raised {type(e).__name__}: {e}"
    ep.extra = json_safe(ep.extra, f"{ep.key} extra")
    return ep


async def open_pool(envs: list[tuple[str, dict[str, Any]]], num_workers: int = 0, backend: str = "process",
                    timeout: float = 60.0) -> Any:
    """An env pool (``crl_envs.pool.make_pool``) over ``envs`` (``(env id, make kwargs)`` a slot), started.

    ``num_workers=0`` runs the envs in this process (a thread each); otherwise in that many worker
    processes, or Ray actors (``backend="ray"``). A pool that fails to start is closed before the error
    is raised.
    """
    from crl_envs.pool import make_pool

    pool = None
    try:
        pool = make_pool(envs, backend if num_workers > 0 else "inline", num_workers=num_workers or None,
                         timeout=timeout)
        await pool.start()
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    return pool


async def play(
    pool: Any,
    agent: Agent,
    contexts: list[EpisodeContext],
    *,
    oracle: bool = False,
    on_step: Callable[[EpisodeContext, Step], None] | None = None,
    on_end: Callable[[EpisodeContext, Episode], None] | None = None,
) -> list[Episode]:
    """Play ``contexts`` concurrently on ``pool``, each on a free slot of its env id (so at most as many
    at once as the pool has slots); returns their episodes in the order of ``contexts``.

    ``oracle``: each episode's ``ctx.oracle`` is its slot's solver. ``on_step`` hears each step and
    ``on_end`` each episode as it ends (after its slot is free again).
    """
    free: dict[str, asyncio.Queue] = {}
    for i in range(pool.num_slots):
        free.setdefault(pool.env_id(i), asyncio.Queue()).put_nowait(PoolSlot(pool, i))

    async def one(ctx: EpisodeContext) -> Episode:
        slots = free[ctx.env_id]
        slot = await slots.get()
        try:
            if oracle:
                ctx = dataclasses.replace(ctx, oracle=slot.oracle())
            step_hook = None if on_step is None else lambda step: on_step(ctx, step)
            episode = await run_episode(slot, agent, ctx, on_step=step_hook)
        finally:
            slots.put_nowait(slot)
        if on_end is not None:
            on_end(ctx, episode)
        return episode

    return list(await asyncio.gather(*(one(c) for c in contexts)))


class PoolSlot:
    """One slot of an env pool (``crl_envs.pool.make_pool``: inline, process or Ray) as an :class:`EnvSlot`."""

    def __init__(self, pool: Any, slot: int):
        self.pool, self.slot = pool, slot

    async def reset(self, seed: int):
        return await self.pool.reset(self.slot, seed=seed)

    async def step(self, action: str):
        return await self.pool.step(self.slot, action)

    def oracle(self) -> Callable[[], Awaitable[str]]:
        """The env's solver action for the current state, as the oracle agent's ``ctx.oracle`` (arguments go to
        ``oracle_action``: a persistent-world solver takes ``memory=``)."""
        async def act(*args: Any, **kwargs: Any) -> str:
            return await self.pool.call(self.slot, "oracle_action", *args, **kwargs)

        return act


class CallableSlot:
    """Adapts a plain (synchronous) Gymnasium env to :class:`EnvSlot` for scripts and tests.

    The calls run on the event loop's thread: for envs whose steps are slow, use an inline pool
    (``crl_envs.pool.make_pool(..., backend="inline")``), which runs them off the loop.
    """

    def __init__(self, env: Any):
        self.env = env

    async def reset(self, seed: int):
        return self.env.reset(seed=seed)

    async def step(self, action: str):
        return self.env.step(action)

    def oracle(self) -> Callable[[], Awaitable[str]]:
        async def act(*args: Any, **kwargs: Any) -> str:
            return self.env.unwrapped.oracle_action(*args, **kwargs)

        return act
