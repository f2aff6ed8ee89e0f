"""How a learner's new weights reach the backend that plays the next rollouts.

A trainer picks one of two when it builds its models:

- :class:`SharedWeights` (the transformers backend): the learner trains the backend's own
  (LoRA-wrapped) model in place. The update must not run while the backend computes a batch, so it
  runs on the backend's own thread between batches (:meth:`TransformersLLM.update_weights`), which
  then drops its prefix cache; samples are stamped with the learner's version.
- :class:`ExportedAdapter` (vLLM): the learner trains a copy of its own. After an update that changed
  the weights the adapter is exported to a folder and the backend loads it under a new id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class SharedWeights:
    """The backend serves the very weights the learner trains (see the module docstring)."""

    def __init__(self, llm: Any):
        self.llm = llm

    async def run_update(self, update: Callable[[], T]) -> T:
        """Run ``update`` (the learner's optimiser steps) where no batch runs meanwhile; returns its result."""
        out: list[T] = []
        await self.llm.update_weights(lambda _model: out.append(update()))
        return out[0]

    def publish(self, learner: Any, updated: bool) -> None:
        """After :meth:`run_update`: the next samples carry the learner's version."""
        self.llm.set_policy_version(learner.version)

    def restore(self, learner: Any) -> None:
        """After a checkpoint is loaded into the learner (the weights are already the backend's own)."""
        self.llm.set_policy_version(learner.version)


class ExportedAdapter:
    """The backend loads the learner's adapter from ``folder`` after each update (see the module docstring)."""

    def __init__(self, llm: Any, folder: Path):
        self.llm, self.folder = llm, Path(folder)

    async def run_update(self, update: Callable[[], T]) -> T:
        """Run ``update`` on a worker thread (the backend keeps serving the old adapter meanwhile)."""
        return await asyncio.to_thread(update)

    def publish(self, learner: Any, updated: bool) -> None:
        """Export the adapter and load it under the learner's version, if the update changed the weights."""
        if updated:
            from crl_agent.rl.lora import export_weights

            export_weights(learner.model, self.folder)
            self.llm.load_adapter(str(self.folder), version=learner.version)

    def restore(self, learner: Any) -> None:
        """After a checkpoint is loaded into the learner: serve its adapter (none before the first update)."""
        self.llm.set_policy_version(learner.version)
        if learner.version:
            from crl_agent.rl.lora import export_weights

            self.llm.load_adapter(str(export_weights(learner.model, self.folder)), version=learner.version)
