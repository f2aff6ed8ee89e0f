"""ALFWorld on the real TextWorld engine: generated games on real floor plans, and the official games.

Ids: ``crl/ALFWorld-v0`` (the six task types mixed), ``crl/ALFWorld-{PickPlace,Look,PickClean,
PickHeat,PickCool,PickTwo}-v0`` and ``crl/ALFWorld-Official-v0`` (needs ``$ALFWORLD_DATA``).
Heavy imports (alfworld, textworld, Fast Downward) happen when an env is built.
"""

from __future__ import annotations

from crl_envs.alfworld.generator import GENERATOR_VERSION, TASK_TYPES

__all__ = ["GENERATOR_VERSION", "TASK_TYPES", "ALFWorldEnv"]


def __getattr__(name: str):
    if name == "ALFWorldEnv":
        from crl_envs.alfworld.env import ALFWorldEnv

        return ALFWorldEnv
    raise AttributeError(name)
