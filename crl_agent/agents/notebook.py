"""Memory baselines for the experience track (persistent worlds, :mod:`crl_envs.persistent`).

Both agents act with the env's own solver (``needs_solver``), so the only thing that differs between
playing with and without memory is what they remember:

- ``oracle-memory`` (:class:`RememberingOracleAgent`): at the end of each episode it keeps the
  hidden facts the env reports in ``info["facts"]`` (privileged, exact), per ``(env id, world)``, and
  hands them to the solver (``oracle_action(memory=...)``) in the world's next episodes.
- ``notebook`` (:class:`NotebookAgent`): a plain key-value notebook. It reads only the observation
  text: each line that reports a discovery (``Note: corridor 2 is a dead end.``, ``You open the
  drawer 1. ... In it, you see a mug 1.``) becomes an entry ``key -> value`` under ``(env id,
  world)`` (``corridor 2 -> dead end``, ``mug -> drawer 1``), and in the world's next episodes it
  reads the entries back and tells the solver.

**The memory protocol** (what ``eval.run --stream`` relies on, and any memory agent implements):

- read memory only when ``ctx.with_experience`` is true; write it only when ``ctx.learning`` is true;
- ``memory_reset()`` forgets everything (the harness calls it before the with-memory pass).

**What they record** (the viewer's stream page shows it): each turn's trace holds ``memory_read``, what
the episode recalled of its world (the solver's ``memory``), and a finished episode's ``extra`` holds
``memory_written`` (how many entries it wrote) and ``memory_write`` (the entries themselves: the facts for
``oracle-memory``, the notebook lines for ``notebook``).
"""

from __future__ import annotations

import re
from typing import Any

from crl_agent.agents.base import Agent, Policy
from crl_agent.episode import Episode, EpisodeContext
from crl_envs.persistent import merge_facts

_NOTE_CORRIDOR = re.compile(r"Note: corridor (\d+) (is a dead end|goes through)")


def world_key(env_id: str, info: dict[str, Any]) -> tuple[str, Any]:
    """The memory key of an episode: its env id and world (its goal text where the env has no worlds)."""
    return env_id, info.get("world", info.get("task", ""))


class _SolverPolicy(Policy):
    """Asks the env's solver, telling it what the agent remembers of this world."""

    def __init__(self, agent: _MemoryAgent, ctx: EpisodeContext):
        if ctx.oracle is None:
            raise RuntimeError(f"{ctx.env_id} has no solver; the {agent.name} agent cannot play it")
        self.agent, self.ctx = agent, ctx
        self.memory: dict[str, Any] | None = None
        self.recalled: dict[str, Any] = {}
        self.key: tuple[str, Any] | None = None

    async def act(self, obs: str, info: dict[str, Any]) -> str:
        if self.key is None:
            self.key = world_key(self.ctx.env_id, info)
            if self.ctx.with_experience:
                self.memory = self.agent.recall(self.key)
                self.recalled = dict(self.memory or {})
        self.agent.observe(self.key, obs, self.ctx)
        if self.memory:
            return await self.ctx.oracle(memory=self.memory)
        return await self.ctx.oracle()

    def turn_trace(self) -> dict[str, Any] | None:
        return {"memory_read": self.recalled} if self.recalled else None


class _MemoryAgent(Agent):
    needs_solver = True

    def __init__(self) -> None:
        self.store: dict[tuple[str, Any], dict[str, Any]] = {}

    def make_policy(self, ctx: EpisodeContext) -> Policy:
        return _SolverPolicy(self, ctx)

    def recall(self, key: tuple[str, Any]) -> dict[str, Any] | None:
        return self.store.get(key)

    def observe(self, key: tuple[str, Any], obs: str, ctx: EpisodeContext) -> None:  # noqa: B027 - optional
        """Called with every observation the policy acts on."""

    def memory_reset(self) -> None:
        """Forget everything (the memory protocol's hook)."""
        self.store.clear()

    def write(self, key: tuple[str, Any], facts: dict[str, Any], episode: Episode) -> None:
        self.store[key] = merge_facts(self.store.get(key), facts)
        episode.extra["memory_written"] = len(facts)
        episode.extra["memory_write"] = facts

    def config(self) -> dict[str, Any]:
        return {**super().config(), "memory_protocol": "with_experience/learning/memory_reset"}


class RememberingOracleAgent(_MemoryAgent):
    """The solver with memory: keeps each episode's ``info["facts"]`` per world and hands them back."""

    name = "oracle-memory"

    def on_episode_end(self, ctx: EpisodeContext, episode: Episode) -> None:
        if not ctx.learning or not episode.steps:
            return
        info = episode.steps[-1].info
        if "facts" in info:
            self.write(world_key(ctx.env_id, info), dict(info["facts"]), episode)


class NotebookAgent(_MemoryAgent):
    """A key-value notebook written from the observation text and read back in the world's next episodes."""

    name = "notebook"

    def __init__(self) -> None:
        super().__init__()
        self._notes: dict[str, dict[str, str]] = {}  # per episode in flight: key -> value, from its text
        self._keys: dict[str, tuple[str, Any]] = {}

    def observe(self, key: tuple[str, Any], obs: str, ctx: EpisodeContext) -> None:
        ep = f"{ctx.env_id}#{ctx.seed}#{ctx.sample}"
        self._keys[ep] = key
        self._notes.setdefault(ep, {}).update(read_notes(obs))

    def on_episode_end(self, ctx: EpisodeContext, episode: Episode) -> None:
        ep = f"{ctx.env_id}#{ctx.seed}#{ctx.sample}"
        notes, key = self._notes.pop(ep, {}), self._keys.pop(ep, None)
        notes.update(read_notes(episode.final_observation))
        if not ctx.learning or key is None or not notes:
            return
        self.store[key] = {**self.store.get(key, {}), **notes}
        episode.extra["memory_written"] = len(notes)
        episode.extra["memory_write"] = notes

    def recall(self, key: tuple[str, Any]) -> dict[str, Any] | None:
        notes = self.store.get(key)
        return facts_from_notes(notes) if notes else None


def read_notes(obs: str) -> dict[str, str]:
    """The discoveries an observation states, as notebook entries (``corridor 2 -> dead end``, ``mug -> drawer 1``)."""
    from crl_envs.alfworld.house import seen_in

    notes = {f"corridor {n}": ("dead end" if what == "is a dead end" else "goes through")
             for n, what in _NOTE_CORRIDOR.findall(obs)}
    recep, items = seen_in(obs)
    if recep is not None and items is not None:
        notes[f"searched {recep}"] = "yes"
        for item in items:
            notes.setdefault(item.rsplit(" ", 1)[0], recep)
    return notes


def facts_from_notes(notes: dict[str, str]) -> dict[str, Any]:
    """Notebook entries as the solver's ``memory`` (the ``facts`` of :mod:`crl_envs.persistent`)."""
    facts: dict[str, Any] = {}
    for key, value in notes.items():
        m = re.fullmatch(r"corridor (\d+)", key)
        if m:
            if value == "goes through":
                facts["through"] = int(m.group(1))
            else:
                facts.setdefault("dead_ends", []).append(int(m.group(1)))
        elif key.startswith("searched "):
            facts.setdefault("searched", []).append(key[len("searched "):])
        else:
            facts.setdefault("locations", {})[key] = value
    return facts
