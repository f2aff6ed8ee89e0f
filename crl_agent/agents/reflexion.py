"""``reflexion``: the ``llm`` agent plus Reflexion's verbal memory (Shinn et al., 2023).

After each failed episode the same LLM writes a short *reflection* (what went wrong, what to do
next time) from the goal, the last steps and the outcome; it is stored under the episode's memory
key (its env id and ``info["world"]`` in a persistent world, else its goal text) and the latest
``max_reflections`` of that key go into the system prompt of the key's later episodes, as
Reflexion retrieves by task. Reflections are written off the episode loop (an asyncio task); the
next episode of the same key waits for them, so a stream's order holds.

It follows the memory protocol of the experience track (:mod:`eval.stream`): reads only when
``ctx.with_experience``, writes only when ``ctx.learning``; ``memory_reset()`` forgets everything.
"""

from __future__ import annotations

import asyncio
from typing import Any

from crl_agent.agents.llm import LLMAgent, LLMPolicy
from crl_agent.agents.notebook import world_key
from crl_agent.episode import Episode, EpisodeContext
from crl_agent.llm import SamplingParams

REFLECT_PROMPT = (
    "You tried a task and failed. In at most two sentences, say what went wrong and what you will do "
    "differently next time in this same place. Be concrete (name the places, objects or directions).")


class ReflexionPolicy(LLMPolicy):
    """An episode of the ``reflexion`` agent: the ``llm`` policy with its reflections in the system prompt."""

    def __init__(self, agent: ReflexionAgent, ctx: EpisodeContext):
        super().__init__(agent, ctx)
        self.shown: list[str] = []

    async def system_prompt(self, obs: str, info: dict[str, Any]) -> str:
        base = await super().system_prompt(obs, info)
        key = world_key(self.ctx.env_id, info)
        self.agent.keys[self.ctx.seed] = key
        if not self.ctx.with_experience:
            return base
        await self.agent.settle(key)
        self.shown = self.agent.reflections.get(key, [])[-self.agent.max_reflections:]
        if not self.shown:
            return base
        lessons = "\n".join(f"- {r}" for r in self.shown)
        return f"{base}\n\nReflections from your earlier attempts in this place:\n{lessons}"

    def turn_trace(self) -> dict[str, Any] | None:
        trace = super().turn_trace()
        if len(self.turns) == 1 and self.shown:
            trace = {**(trace or {}), "memory_read": list(self.shown)}
        return trace


class ReflexionAgent(LLMAgent):
    """The ``llm`` agent with a reflection written after each failure and retrieved by task.

    Args:
        seed, model, backend: as :class:`~crl_agent.agents.llm.LLMAgent` (the harness's ``--model``/``--backend``).
        max_reflections: reflections shown per episode (the latest of its key).
        reflection_tokens: cap on each reflection.
        **kwargs: as :class:`~crl_agent.agents.llm.LLMAgent`.
    """

    name = "reflexion"
    policy_class = ReflexionPolicy

    def __init__(self, seed: int = 0, model: str | None = None, backend: str = "transformers",
                 max_reflections: int = 3, reflection_tokens: int = 64, **kwargs: Any):
        super().__init__(seed=seed, model=model, backend=backend, **kwargs)
        self.max_reflections, self.reflection_tokens = int(max_reflections), int(reflection_tokens)
        self.reflections: dict[tuple[str, Any], list[str]] = {}
        self.keys: dict[int, tuple[str, Any]] = {}
        self._pending: dict[tuple[str, Any], list[asyncio.Task]] = {}

    def memory_reset(self) -> None:
        """Forget every reflection (the memory protocol's hook)."""
        self.reflections.clear()

    async def settle(self, key: tuple[str, Any]) -> None:
        """Wait for the reflections still being written for ``key``."""
        tasks = self._pending.pop(key, [])
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def on_episode_end(self, ctx: EpisodeContext, episode: Episode) -> None:
        key = self.keys.pop(ctx.seed, None)
        if key is None or episode.success or episode.error or not ctx.learning:
            return
        task = asyncio.get_running_loop().create_task(self._reflect(key, episode))
        self._pending.setdefault(key, []).append(task)
        episode.extra["reflection_queued"] = 1

    async def _reflect(self, key: tuple[str, Any], episode: Episode) -> None:
        steps = episode.steps[-6:]
        trail = "\n".join(f"Observation: {s.observation[-400:]}\nAction: {s.action}" for s in steps)
        prompt = (f"Task: {episode.task}\nYour last steps:\n{trail}\nFinal observation: "
                  f"{episode.final_observation[-400:]}\nOutcome: failed after {episode.actions} steps.")
        reply = await self.llm.chat([{"role": "system", "content": REFLECT_PROMPT},
                                     {"role": "user", "content": prompt}],
                                    SamplingParams(max_tokens=self.reflection_tokens, temperature=0.0))
        text = " ".join(reply.text.split())
        if text:
            self.reflections.setdefault(key, []).append(text)

    async def aclose(self) -> None:
        for key in list(self._pending):
            await self.settle(key)
        await super().aclose()

    def config(self) -> dict[str, Any]:
        return {**super().config(), "max_reflections": self.max_reflections,
                "reflection_tokens": self.reflection_tokens}
