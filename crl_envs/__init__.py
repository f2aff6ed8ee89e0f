"""crl-bench text environments for LLM agents.

Importing this package registers every ``crl/*`` id with Gymnasium and loads
third-party envs from the ``crl_envs.plugins`` entry-point group.
"""

from __future__ import annotations

from crl_envs.core import InvalidAction, StepOutcome, TextEnv
from crl_envs.registry import crl_env_ids, load_plugins, make, register_builtin_envs
from crl_envs.spaces import UnicodeText

__version__ = "0.1.0"
__all__ = ["InvalidAction", "StepOutcome", "TextEnv", "UnicodeText", "crl_env_ids", "make", "__version__"]

register_builtin_envs()
load_plugins()
