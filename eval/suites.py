"""Task sets, as in the Complementary RL paper: defined in :mod:`crl_envs.task_sets`, which the trainer
(``crl_agent.train --tasks``) shares with the harness; re-exported here for ``eval``'s callers."""

from __future__ import annotations

from crl_envs.task_sets import TASK_SETS, TaskSetError, resolve_tasks

__all__ = ["TASK_SETS", "TaskSetError", "resolve_tasks"]
